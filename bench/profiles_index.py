"""How long a large measured-profiles file takes to load and to match (docs/stage-policy.md).

    python bench/profiles_index.py [--entries 200000] [--format json|yaml] [--lookups 20000]

Writes a file of distinct entries (models 3 % apart in size, every GPU in the catalog, 1-8 GPUs, every
precision), loads it the way the settings do (``ProfileBook.load``) and times ``match`` for pods
that hit an entry and pods that miss every entry. The match is a lookup in an index keyed by GPU,
count, precision and size band, so its time must not grow with the number of entries.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from app.base.catalog import default_catalog
from app.base.workload import Precision, WorkloadSpec
from app.serving.profiles import ProfileBook


def entries(n: int) -> list[dict[str, Any]]:
    gpus = [e.name for e in default_catalog().entries]
    out: list[dict[str, Any]] = []
    k = 0
    while len(out) < n:
        params = 1e8 * 1.03 ** (k // (len(gpus) * 8 * len(Precision)))
        rest = k % (len(gpus) * 8 * len(Precision))
        gpu, rest = gpus[rest % len(gpus)], rest // len(gpus)
        count, prec = rest % 8 + 1, list(Precision)[rest // 8]
        out.append({"model": f"m-{k}", "model_params": f"{params / 1e9:.6g}B", "gpu": gpu, "gpus": count,
                    "precision": prec.value, "ms_per_token": 10 + k % 50, "max_concurrency": 8})
        k += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--format", choices=("json", "yaml"), default="json")
    ap.add_argument("--lookups", type=int, default=20_000)
    args = ap.parse_args()
    data = {"profiles": entries(args.entries)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"profiles.{args.format}"
        path.write_text(json.dumps(data) if args.format == "json" else yaml.safe_dump(data))
        t0 = time.perf_counter()
        book = ProfileBook.load(path)
        load_s = time.perf_counter() - t0
    catalog = default_catalog()
    probes = data["profiles"][:: max(1, args.entries // args.lookups)][: args.lookups]
    specs = []
    for e in probes:
        spec = WorkloadSpec(namespace="a", name="p", gpus=e["gpus"],
                            model_params=float(e["model_params"][:-1]) * 1e9)
        gpu = catalog.lookup(e["gpu"])
        assert gpu is not None
        specs.append((spec, gpu, Precision(e["precision"])))
    t0 = time.perf_counter()
    hits = sum(book.match(s, g, p) is not None for s, g, p in specs)
    hit_us = (time.perf_counter() - t0) / len(specs) * 1e6
    miss = [(s.model_copy(update={"model_params": 7.77e15}), g, p) for s, g, p in specs]
    t0 = time.perf_counter()
    misses = sum(book.match(s, g, p) is None for s, g, p in miss)
    miss_us = (time.perf_counter() - t0) / len(miss) * 1e6
    print(f"{args.entries} entries ({args.format}): load {load_s:.2f} s; match {hit_us:.1f} us "
          f"({hits}/{len(specs)} hit), miss {miss_us:.1f} us ({misses}/{len(miss)} missed)")


if __name__ == "__main__":
    main()
