"""scripts/llama_server_suite_check.py reads both runs' reports and names every test whose outcome differs."""

from __future__ import annotations

from scripts.llama_server_suite_check import Run, read_report, table

DIRECT = """<testsuites><testsuite>
<testcase classname="unit.test_a" name="test_same"/>
<testcase classname="unit.test_a" name="test_moved"/>
<testcase classname="unit.test_b" name="test_both_fail"><failure message="assert 1 == 2"/></testcase>
<testcase classname="unit.test_b" name="test_hub"><skipped message="no hub"/></testcase>
</testsuite></testsuites>"""

THROUGH = """<testsuites><testsuite>
<testcase classname="unit.test_a" name="test_same"/>
<testcase classname="unit.test_a" name="test_moved"><error message="toolpair did not get ready"/></testcase>
<testcase classname="unit.test_b" name="test_both_fail"><failure message="assert 1 == 2"/></testcase>
<testcase classname="unit.test_b" name="test_hub"><skipped message="no hub"/></testcase>
</testsuite></testsuites>"""


def run(xml: str) -> Run:
    outcomes, messages = read_report(xml)
    return Run(outcomes, messages, 1.0)


def test_a_changed_outcome_is_named_and_counted_in_its_files_row() -> None:
    text, differences = table(run(DIRECT), run(THROUGH))
    assert differences == ["unit/test_a.py::test_moved: direct passed, through error: toolpair did not get ready"]
    rows = text.splitlines()
    assert rows[2] == "| test_a.py | 2 | 2 / 0 / 0 / 0 | 1 / 0 / 1 / 0 | 1 | 1 |"
    assert rows[3] == "| test_b.py | 2 | 0 / 1 / 0 / 1 | 0 / 1 / 0 / 1 | 2 | 0 |"
    assert rows[4] == "| all | 4 | 2 / 1 / 0 / 1 | 1 / 1 / 1 / 1 | 3 | 1 |"


def test_a_teardown_error_after_a_failure_keeps_the_failure() -> None:
    xml = """<testsuites><testsuite>
    <testcase classname="unit.test_a" name="test_x"><failure message="boom"/></testcase>
    <testcase classname="unit.test_a" name="test_x"><error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    assert read_report(xml)[0] == {"unit/test_a.py::test_x": "failed"}


def test_identical_runs_differ_nowhere() -> None:
    assert table(run(DIRECT), run(DIRECT))[1] == []
