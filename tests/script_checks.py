"""The checks of the script tests (tests/test_results_py.py, tests/test_result_set_rule.py): each
failing check printed as it happens and counted; the run ends with status 1 if any failed."""
import sys

failures = []


def check(cond, what):
    """`what` noted as failed unless cond."""
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def finish(passed):
    """Exit with status 1 and the number of failed checks, or print `passed`."""
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print(passed)
