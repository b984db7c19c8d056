"""Training data at WMT scale: preparation, start-up and memory at several corpus sizes.

Preparation time and memory, start-up on prepared data, and resident memory while
training, at several corpus sizes.

A seeded synthetic parallel corpus with WMT14 en-de-like sentence lengths (log-normal
word counts, median 18 and mean about 22 words, a long tail; the target about as long
as the source, with noise) and Zipf-distributed words made of syllables (the German
side with umlauts) is written for every size; smaller corpora are prefixes of larger
ones. For each size, as separate processes (the way users run them):

1. ``seqtrans prepare translation`` with a 37,000-piece vocabulary: wall time and the
   peak resident memory of the process and its workers together;
2. ``seqtrans run translation`` on the prepared data with a tiny model: the time from
   the command's start to its first update (the log's ``step 1`` line), whether it
   prepared anything, and its resident memory at update 100.

Memory is read from ``/proc`` (Linux), every 0.25 s. Usage::

    python -m benchmarks data_scale                      # 0.5 M, 1.5 M and 4.5 M pairs
    python -m benchmarks data_scale --pairs 100000       # a quick look

Writes ``benchmarks/results/data_scale-cpu.json``; the corpora and caches go under
``--work`` (default: the system's temporary directory), several GB at 4.5 M pairs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, arguments, device_name, write_results

CHUNK = 100_000
WORD_TYPES = 60_000
TARGETS = {"prepare_minutes_4.5M": 8.0, "prepare_peak_gb_4.5M": 2.0, "first_update_s": 10.0,
           "rss_growth_mb_4.5M_over_0.5M": 300.0}


# ----------------------------------------------------------------------------- the corpus


def _words(rng: np.random.Generator, count: int, vowels: list[str]) -> list[str]:
    """``count`` distinct words built from syllables, the frequent ones short."""
    onsets = ["", "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w", "st", "tr", "sch"]
    codas = ["", "", "n", "r", "s", "t", "l", "ng"]
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        syllables = 1 + min(3, int(rng.exponential(0.4 + 1.6 * len(out) / count)))
        word = "".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                       + codas[rng.integers(len(codas))] for _ in range(syllables))
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def generate(directory: Path, pairs: int, seed: int = 1) -> dict[str, Path]:
    """Write ``train.en``/``train.de`` of ``pairs`` lines and 500-line dev and test files
    (kept when already there: a marker holds the parameters)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / "corpus.json"
    spec = {"pairs": pairs, "seed": seed, "word_types": WORD_TYPES, "version": 1}
    files = {f"{split}_{lang}": directory / f"{split}.{'en' if lang == 'src' else 'de'}"
             for split in ("train", "dev", "test") for lang in ("src", "tgt")}
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return files
    vocab_rng = np.random.default_rng([seed, 0])
    words = {"en": np.array(_words(vocab_rng, WORD_TYPES, list("aeiou") + ["ou", "ea"]), dtype=object),
             "de": np.array(_words(vocab_rng, WORD_TYPES, list("aeiou") + ["ä", "ö", "ü", "ei", "ie"]),
                            dtype=object)}
    zipf = np.cumsum(1.0 / np.arange(1, WORD_TYPES + 1) ** 1.05)
    zipf /= zipf[-1]

    def sentences(rng: np.random.Generator, lengths: np.ndarray, lang: str) -> list[str]:
        ids = np.searchsorted(zipf, rng.random(int(lengths.sum())))
        tokens = words[lang][ids]
        cuts = np.cumsum(lengths)[:-1]
        return [" ".join(s) + " ." for s in np.split(tokens, cuts)]

    def write(split: str, count: int, seed_base: int) -> None:
        with open(files[f"{split}_src"], "w", encoding="utf-8") as en, \
                open(files[f"{split}_tgt"], "w", encoding="utf-8") as de:
            for start in range(0, count, CHUNK):
                n = min(CHUNK, count - start)
                rng = np.random.default_rng([seed, seed_base, start // CHUNK])
                src = np.clip(np.rint(rng.lognormal(np.log(18), 0.65, n)), 1, 250).astype(np.int64)
                tgt = np.clip(np.rint(src * rng.lognormal(-0.03, 0.15, n)), 1, 250).astype(np.int64)
                en.write("\n".join(sentences(rng, src, "en")) + "\n")
                de.write("\n".join(sentences(rng, tgt, "de")) + "\n")

    started = time.perf_counter()
    write("train", pairs, 1)
    write("dev", 500, 2)
    write("test", 500, 3)
    marker.write_text(json.dumps(spec))
    sizes = [files[k].stat().st_size / 1e6 for k in ("train_src", "train_tgt")]
    print(f"generated {pairs:,} pairs in {time.perf_counter() - started:.0f} s "
          f"({sizes[0]:.0f} + {sizes[1]:.0f} MB)", flush=True)
    return files


# ----------------------------------------------------------------------------- measuring


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:
            pass
    return out


def rss_bytes(pid: int, *, tree: bool = True) -> int:
    """Resident memory of ``pid`` (and, with ``tree``, of all its descendants)."""
    total = 0
    for p in _descendants(pid) if tree else [pid]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _rss_parts(pid: int) -> dict[str, int]:
    parts = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
            parts[line.split(":")[0]] = int(line.split()[1]) * 1024
    return parts


class Watched:
    """A command run with its stderr read line by line and its memory sampled."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.peak = 0
        self.lines: list[tuple[float, str]] = []
        self._done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_bytes(self.proc.pid))
            time.sleep(0.25)

    def wait_for(self, pattern: str) -> tuple[float, int, dict[str, int]] | None:
        """Seconds from the start when a stderr line matches, the process's own resident
        memory then, and its anonymous and file-backed parts; None if it ends first."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            now = time.perf_counter() - self.started
            self.lines.append((now, line.rstrip()))
            if re.search(pattern, line):
                return now, rss_bytes(self.proc.pid, tree=False), _rss_parts(self.proc.pid)
        return None

    def finish(self, *, kill: bool = False) -> float:
        if kill:
            self.proc.kill()
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.perf_counter() - self.started, line.rstrip()))
        self.proc.wait()
        self._done.set()
        return time.perf_counter() - self.started

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines[-30:])


def data_settings(files: dict[str, Path], vocab: int) -> list[str]:
    return ["data.dataset=none", f"data.vocab_size={vocab}",
            *(f"data.{name}={path}" for name, path in files.items())]


def measure(files: dict[str, Path], work: Path, pairs: int, *, vocab: int, workers: int) -> dict[str, Any]:
    cache = work / f"cache-{pairs}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "SEQTRANS_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    settings = [*data_settings(files, vocab), f"train.prepare_workers={workers}"]
    seqtrans = [sys.executable, "-m", "seqtrans"]

    prep = Watched([*seqtrans, "prepare", "translation", "--set", *settings], env)
    seconds = prep.finish()
    if prep.proc.returncode != 0:
        raise SystemExit(f"prepare failed:\n{prep.log()}")
    assert prep.proc.stdout is not None
    summary = json.loads(prep.proc.stdout.read())
    print(f"{pairs:>9,} pairs: prepared in {seconds:.1f} s, peak {prep.peak / 1e9:.2f} GB "
          f"({summary['pairs']:,} pairs kept)", flush=True)

    run_dir = work / f"run-{pairs}"
    shutil.rmtree(run_dir, ignore_errors=True)
    tiny = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=64", "model.d_ff=128",
            "model.heads=2", "train.max_tokens=1000", "train.max_steps=1000", "train.log_every=100",
            "train.eval_every=100000", "train.checkpoint_every=100000", "train.max_length=256"]
    run = Watched([*seqtrans, "run", "translation", "--device", "cpu", "--out", str(run_dir), "--set",
                   *settings, *tiny], env)
    first = run.wait_for(r"step 1 \|")
    hundred = run.wait_for(r"step 100 \|")
    run.finish(kill=True)
    if first is None or hundred is None:
        raise SystemExit(f"run failed:\n{run.log()}")
    prepared_again = any("prepared data: " in line and " in " in line and "reusing" not in line
                         for _, line in run.lines)
    reused = any("prepared data: reusing" in line for _, line in run.lines)
    print(f"{'':>9}  first update {first[0]:.1f} s after start (reused: {reused}); "
          f"resident at update 100: {hundred[1] / 1e6:.0f} MB "
          f"({', '.join(f'{k} {v / 1e6:.0f}' for k, v in hundred[2].items())})", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"pairs": pairs, "pairs_kept": summary["pairs"], "tokens": summary["tokens"],
            "removed": summary["removed"], "prepare_s": round(seconds, 1),
            "prepare_peak_rss_gb": round(prep.peak / 1e9, 3), "first_update_s": round(first[0], 2),
            "run_reused_prepared": reused, "run_prepared_again": prepared_again,
            "rss_at_update_100_mb": round(hundred[1] / 1e6, 1),
            "rss_parts_at_update_100_mb": {k: round(v / 1e6, 1) for k, v in hundred[2].items()},
            "corpus_mb": round(sum(files[k].stat().st_size for k in ("train_src", "train_tgt")) / 1e6, 1)}


def main(argv: list[str]) -> None:
    parser = arguments(__doc__)
    parser.add_argument("--pairs", type=int, nargs="+", default=[500_000, 1_500_000, 4_500_000])
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument("--workers", type=int, default=0, help="train.prepare_workers (0: one per core)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "seqtrans-data-scale")
    parser.add_argument("--keep", action="store_true", help="Keep the corpora and caches.")
    parser.add_argument("--name", default="data_scale", help="Result file name (before -cpu.json).")
    args = parser.parse_args(argv)
    rows = []
    for pairs in sorted(args.pairs):
        files = generate(args.work / f"corpus-{pairs}", pairs)
        rows.append(measure(files, args.work, pairs, vocab=args.vocab, workers=args.workers))
        if not args.keep:
            shutil.rmtree(args.work / f"cache-{pairs}", ignore_errors=True)
    by_size = {r["pairs"]: r for r in rows}
    print()
    print(f"{'pairs':>10} {'prepare s':>10} {'peak GB':>8} {'1st update s':>13} {'RSS@100 MB':>11}")
    for r in rows:
        print(f"{r['pairs']:>10,} {r['prepare_s']:>10.1f} {r['prepare_peak_rss_gb']:>8.2f} "
              f"{r['first_update_s']:>13.1f} {r['rss_at_update_100_mb']:>11.0f}")
    result: dict[str, Any] = {"rows": rows, "targets": TARGETS, "vocab": args.vocab,
                              "cpus": os.cpu_count(), "device": device_name_cpu()}
    small, large = min(by_size), max(by_size)
    if small != large:
        growth = by_size[large]["rss_at_update_100_mb"] - by_size[small]["rss_at_update_100_mb"]
        result["rss_growth_mb"] = {"from": small, "to": large, "mb": round(growth, 1),
                                   "ratio": round(by_size[large]["rss_at_update_100_mb"]
                                                  / by_size[small]["rss_at_update_100_mb"], 3)}
        print(f"resident memory at update 100, {large:,} against {small:,} pairs: +{growth:.0f} MB "
              f"({result['rss_growth_mb']['ratio']:.2f}x)")
    path = write_results(RESULTS / f"{args.name}-cpu.json",
                         {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **result}, sort_keys=False)
    print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)


def device_name_cpu() -> str:
    import torch

    return device_name(torch.device("cpu")).rsplit(",", 1)[0]
