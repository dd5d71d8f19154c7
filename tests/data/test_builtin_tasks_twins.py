"""code-next-line's held-out functions, twins removed before the few-shot pool and the
scored items are drawn: the same function in two modules (or a method with the same
body at another depth) gives one record, that of the first found."""

from __future__ import annotations

from ledgerlm.data.builtin_tasks import Function, code_next_line_records, distinct


def _function(doc: str, i: int, indent: str = "") -> Function:
    body = (
        f"def f{i}(x):",
        f"    y = x * {i}",
        "",
        f"    if y > {i}:",
        f"        y = y - {i}",
        f"    return y + {i}",
    )
    return Function(doc, f"f{i}", tuple(indent + line if line else line for line in body))


def test_each_function_text_gives_one_record_the_first_twins():
    """40 functions, each also in a second module (every other one as a method, one
    level deeper): 40 records, none of a twin; a twin in the few-shot pool would show
    the scored twin's answer."""
    first = [_function(f"mod{i}", i) for i in range(40)]
    twins = [_function(f"copy{i}", i, "    " * (i % 2)) for i in range(40)]
    functions = [x for pair in zip(first, twins, strict=True) for x in pair]
    assert distinct(functions) == first
    records = code_next_line_records(functions, pool=8)
    assert len(records) == 40
    assert {r["doc"] for r in records} == {f"mod{i}" for i in range(40)}
    pool = [r for r in records if r.get("split") == "train"]
    assert len(pool) == 8


def test_functions_that_differ_are_all_kept_in_their_order():
    functions = [_function("a", 1), _function("b", 2), _function("c", 1)]
    functions.append(Function("d", "f1", ("def f1(x):", "    return x")))
    assert [f.doc_id for f in distinct(functions)] == ["a", "b", "d"]
