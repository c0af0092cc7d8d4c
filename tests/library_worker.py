"""A separate process acting on a patient library, for the crash and concurrency tests.

    python tests/library_worker.py LIBRARY import FILE... [--one-by-one] [--pause-at STAGE --marker PATH]
    python tests/library_worker.py LIBRARY remove NAME [--pause-at STAGE --marker PATH]

``--pause-at STAGE`` replaces the library's ``_checkpoint`` hook: when the named stage is
reached the worker creates ``--marker`` and sleeps, so the test can SIGKILL it at exactly that
point. ``--start-after FILE`` waits for FILE once the library is open, so that several
workers start acting together. ``--one-by-one`` imports each file in its own transaction (more interleaving between
concurrent workers). Prints ``opened`` once the library is open, then one line per added
patient; exit code 3 on LibraryError.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gating_core.library.common as library_common  # noqa: E402  (the _checkpoint hook)
from gating_core.library import LibraryError, PatientLibrary  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("library")
    parser.add_argument("action", choices=["import", "remove"])
    parser.add_argument("items", nargs="+")
    parser.add_argument("--one-by-one", action="store_true")
    parser.add_argument("--pause-at")
    parser.add_argument("--marker")
    parser.add_argument("--start-after", metavar="FILE", help="wait until FILE exists before acting")
    args = parser.parse_args()

    if args.pause_at:
        def pause(stage: str) -> None:
            if stage == args.pause_at:
                Path(args.marker).write_text(stage)
                time.sleep(600)

        library_common._checkpoint = pause

    try:
        library = PatientLibrary(args.library)
        print("opened", flush=True)  # lets a test time its kill from here
        if args.start_after:  # a start line for concurrent workers
            while not Path(args.start_after).exists():
                time.sleep(0.005)
        if args.action == "remove":
            for name in args.items:
                library.remove_patient(name)
                print(f"removed {name}", flush=True)
        elif args.one_by_one:
            for item in args.items:
                for name in library.import_files([item]):
                    print(f"added {name}", flush=True)
        else:
            for name in library.import_files(args.items):
                print(f"added {name}", flush=True)
    except LibraryError as exc:
        print(f"LibraryError: {exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
