"""`python -m pipeline` and the `pipeline` console script.

`pipeline --version` is answered here, before click and the CLI are imported:
shells and CI steps ask it often, and it needs nothing else. So is a plain
`pipeline check`: replayed when asked before (`pipeline.replay`), else checked
without the CLI framework when nothing but its flags shapes it (`pipeline.plaincheck`).
"""

import gc
import os
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

        code = replay.run(argv, _full)
        if "pipeline.cli" not in sys.modules:  # replayed, or answered without the CLI
            _end_now(code)
        sys.exit(code)
    sys.exit(_full())


def _end_now(code: int) -> None:
    """End a check answered without the CLI at once: the interpreter's own exit would free the
    check's heap object by object, a tenth of a second of a night's check. Nothing else is
    owed: the caches are saved before `run_check` returns, the record is written, no atexit
    work is pending (its workers are stopped); only the console is flushed."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the interpreter's exit reports it as it would
    os._exit(code)


def _full() -> int:
    from pipeline.cli import main as _main

    return _main()


if __name__ == "__main__":
    main()
