#!/usr/bin/env python3
"""summary.py REPORT_DIR EXPECTED_FAILURES SECONDS: reads the junit
reports e2e.test wrote and prints "N passed, N failed", the expected
failures apart (never counted as passed), and each failed spec with the
first line of its failure. Exit status: 0 when every failure was
expected, 3 when one was not, 1 when there is no report."""
import glob, sys, xml.etree.ElementTree as ET

report, expected_file, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
expected = {}
for line in open(expected_file):
    line = line.rstrip("\n")
    if line and not line.startswith("#"):
        name, _, why = line.partition("\t")
        expected[name.strip()] = why.strip()
files = sorted(glob.glob(report + "/junit*.xml"))
if not files:
    sys.exit(1)
passed, failed, known = [], [], []
for f in files:
    for tc in ET.parse(f).getroot().iter("testcase"):
        name = tc.get("name", "")
        if name.startswith("[SynchronizedBeforeSuite]") or name.startswith("[SynchronizedAfterSuite]") or name.startswith("[ReportAfterSuite]") or name.startswith("[ReportBeforeSuite]"):
            continue
        status = tc.get("status", "")
        fail = tc.find("failure")
        if fail is None:
            fail = tc.find("error")
        if tc.find("skipped") is not None or status in ("skipped", "pending"):
            continue
        if fail is None:
            passed.append(name)
            continue
        msg = (fail.get("message") or fail.text or "").strip().splitlines()
        first = msg[0] if msg else ""
        key = name.split("] ", 1)[1] if name.startswith("[It] ") else name
        if any(key.endswith(e) or e in name for e in expected):
            known.append((name, first))
        else:
            failed.append((name, first))
m, s = divmod(seconds, 60)
print("conformance: %d passed, %d failed, %d expected failures, in %dm%02ds" % (len(passed), len(failed), len(known), m, s))
for name, first in known:
    why = next((w for e, w in expected.items() if e in name), "")
    print("  expected: %s\n    %s" % (name, why))
for name, first in failed:
    print("  FAILED: %s\n    %s" % (name, first))
sys.exit(3 if failed else 0)
