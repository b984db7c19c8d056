"""What a process runs on: threads and their wait policy, the processor and operating
system, the environment variables seqtrans reads, timed choices, files written whole
(:mod:`.atomic`) and verified downloads. The lowest layer: imports nothing else of seqtrans."""
