"""The night's verdicts are kept per ATOM file: the next night unpickles a file's when it checks its
calls, and writes back as read the files whose verdicts it carried unchanged (issue 28 §7)."""

from __future__ import annotations

import pickle

from pipeline.compat.calls import scan_file
from pipeline.compat.carry import CLEAN, Night, Verdict, position_free

A = scan_file(b"import aiter\n\n\ndef f(x):\n    return aiter.gemm(x, w=1)\n", "atom/a.py").calls[0]
B = scan_file(b"import aiter\n\n\ndef g(x):\n    return aiter.norm(x)\n", "atom/b.py").calls[0]


def _verdict(dep: str) -> Verdict:
    return Verdict(CLEAN, "", frozenset({("m", dep, True, "0" * 40)}), None, None)


def test_a_night_reads_back_its_verdicts_per_file_and_writes_unchanged_ones_as_read() -> None:
    last = Night((None,), "p1", None, "p1")
    last.keep(A, _verdict("aiter"))
    last.keep(B, _verdict("aiter.ops"))
    read = pickle.loads(pickle.dumps(last))
    assert read.packed.keys() == {"atom/a.py", "atom/b.py"} and not read.verdicts  # (none unpickled)
    assert read.get(A) == _verdict("aiter") and read.get(B) == _verdict("aiter.ops")
    assert read.get(scan_file(b"import aiter\naiter.gemm(1)\n", "atom/a.py").calls[0]) is None

    tonight = Night((None,), "p2", None, "p2", before=read)
    tonight.keep(A, read.get(A))  # carried
    tonight.keep(B, _verdict("aiter.ops.norm"))  # bound again
    packed: dict[str, bytes] = tonight.__reduce__()[1][4]  # type: ignore[index]
    assert packed["atom/a.py"] is read._read["atom/a.py"]  # (written as it was read)
    assert packed["atom/b.py"] is not read._read["atom/b.py"]
    again = pickle.loads(pickle.dumps(tonight))
    assert again.get(A) == _verdict("aiter") and again.get(B) == _verdict("aiter.ops.norm")
    assert sorted(v.at_pin for v in again.all()) == sorted(v.at_pin for v in tonight.all())


def test_a_calls_key_leaves_out_where_it_stands_and_holds_no_argument_record() -> None:
    moved = scan_file(b"import aiter\n\n\n\n\ndef f(x):\n    return aiter.gemm(x, w=1)\n", "atom/a.py").calls[
        0
    ]
    assert moved.line != A.line and position_free(moved) == position_free(A)
    kept = pickle.dumps(position_free(A))
    assert b"Arg" not in kept and b"calls" not in kept  # (plain tuples: read back in C)


def test_what_calls_in_different_files_read_alike_is_validated_once() -> None:
    """Each file's verdicts are unpickled apart: equal facts are no longer one object, and are
    still checked against tonight's aiter once."""
    from pipeline.compat.carry import Carried

    last = Night((None,), "p1", None, "p1")
    last.keep(A, _verdict("aiter"))
    last.keep(B, _verdict("aiter"))
    read = pickle.loads(pickle.dumps(last))
    got_a, got_b = read.get(A), read.get(B)
    assert got_a is not None and got_b is not None and got_a.at_pin is not got_b.at_pin

    class Index:
        asked = 0

        def still_holds(self, deps: object, unchanged: object) -> bool:
            Index.asked += 1
            return True

    carried = Carried(read, (Index(), frozenset()), (None, None), frozenset(), lambda p: 0, lambda n: None)  # type: ignore[arg-type]
    assert carried.verdict(A) is not None and carried.verdict(B) is not None
    assert Index.asked == 1
