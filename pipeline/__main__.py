"""`python -m pipeline` and the `pipeline` console script.

`pipeline --version` is answered here, before click and the CLI are imported:
shells and CI steps ask it often, and it needs nothing else.
"""

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from pipeline import __version__

        sys.stdout.write(f"atom-image-pipeline, version {__version__}\n")  # click's format
        sys.exit(0)
    from pipeline.cli import main as _main

    sys.exit(_main())


if __name__ == "__main__":
    main()
