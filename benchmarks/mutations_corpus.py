"""The mutation suite (tests/mutations.py) on real exports: every deliberately wrong rewrite, on
up to --per-mutation corpus models where its real pass fires, must be caught by verification
(exit 1, the mutant named). `make test` runs the same mutations on the samples and small graphs;
this runs them where nobody tuned them.

    .venv/bin/python benchmarks/mutations_corpus.py DIR [DIR ...] [--per-mutation 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fuse_cli import api  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.errors import FuseError  # noqa: E402
from fuse_cli.passes import REGISTRY  # noqa: E402
from tests.mutations import MUTATIONS  # noqa: E402


def fired_passes(path: Path, target: str) -> set[str]:
    report = api.optimize(path, FuseConfig(target=target, verify=False, allow_peak_growth=True), dry_run=True).report
    return {f.pass_name for f in report.fusions}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--per-mutation", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    models = [p for folder in args.folders for p in sorted(folder.glob("*.onnx"))]
    fired: dict[tuple[str, str], set[str]] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="fuse-mutations-") as scratch:
        for mutation in MUTATIONS:
            mutant = mutation.make_pass()
            REGISTRY[mutant.name] = mutant
            tried = 0
            for path in models:
                if tried == args.per_mutation:
                    break
                key = (str(path), mutation.target)
                if key not in fired:
                    try:
                        fired[key] = fired_passes(path, mutation.target)
                    except FuseError:
                        fired[key] = set()
                if mutation.base not in fired[key] or not set(mutation.first) <= fired[key] | {mutation.base}:
                    continue
                type(mutant).applied = 0
                config = FuseConfig(target=mutation.target, passes=mutation.first + (mutant.name,),
                                    allow_peak_growth=True)
                report = api.optimize(path, config, Path(scratch) / "out.onnx").report
                if not type(mutant).applied:
                    continue
                tried += 1
                caught = report.exit_code == 1 and [r.pass_name for r in report.rolled_back] == [mutant.name]
                row = {"mutation": mutation.name, "model": path.stem, "caught": caught}
                if not caught:  # what the mutant did to the outputs: below tolerance, no comparison can see it
                    worst = max(report.verification.outputs, key=lambda o: o.max_abs_diff / max(o.atol, 1e-30))
                    row.update(output=worst.name, max_abs_diff=worst.max_abs_diff, atol=worst.atol, rtol=worst.rtol)
                rows.append(row)
                print(json.dumps(rows[-1]), flush=True)
            del REGISTRY[mutant.name]
    caught = sum(r["caught"] for r in rows)
    covered = len({r["mutation"] for r in rows})
    print(f"\nmutations on the corpus: verification caught {caught} of {len(rows)} wrong rewrites "
          f"({100 * caught / max(len(rows), 1):.0f}%), {covered} of {len(MUTATIONS)} mutations found a model "
          "to fire on")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
