"""`python -m pipeline` and the `pipeline` console script.

`pipeline --version` is answered here, before click and the CLI are imported:
shells and CI steps ask it often, and it needs nothing else. So is a repeated
plain `pipeline check` of the same commits (`pipeline.replay`).
"""

import gc
import sys

# The check allocates hundreds of thousands of small, long-lived records (calls, signatures,
# summaries) and few cycles: the default first-generation threshold (700) runs a collection
# every few hundred of them, a fifth of a nightly check's CPU time. Cycles are still collected.
GC_THRESHOLD = (50_000, 20, 20)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLD)
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from pipeline import __version__

        sys.stdout.write(f"atom-image-pipeline, version {__version__}\n")  # click's format
        sys.exit(0)
    if argv[:1] == ["check"]:
        from pipeline import replay

        sys.exit(replay.run(argv, _full))
    sys.exit(_full())


def _full() -> int:
    from pipeline.cli import main as _main

    return _main()


if __name__ == "__main__":
    main()
