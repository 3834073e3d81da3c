#!/usr/bin/env python3
"""Checks tools/spin.lua with tshark on the capture that make_capture writes.

    tshark_test.py <make_capture executable> <tools/spin.lua>

make_capture writes 13 known frames with spin_emu::pcap_writer and prints wire::parse's verdict
for each. The test checks the dissector's exact field values per frame, that it flags (expert
info, group Malformed) exactly the frames the runtime's parser rejects at the spin layer, with
the parser's reason (other expert infos, e.g. a Lua error, fail the test), that it ignores frames to other UDP ports, and that the port preference
works. Fails, never skips, when tshark is missing or cannot run Lua scripts.
"""
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

PI_MALFORMED = 0x07000000  # epan/proto.h: expert group of malformed packets
SPIN_REASONS = ["spin_truncated", "bad_version", "bad_type", "bad_flags", "length_mismatch", "bad_offset"]

# Columns asked from tshark -T fields, in this order.
FIELDS = [
    "frame.number", "frame.time_epoch", "spin.version", "spin.type", "spin.flags", "spin.flags.start",
    "spin.flags.end", "spin.flags.retransmit", "spin.flags.coll", "spin.src_rank", "spin.match_bits",
    "spin.msg_id", "spin.seq", "spin.payload_len", "spin.msg_len", "spin.offset", "spin.coll.op",
    "spin.coll.dtype", "spin.coll.slot", "spin.coll.shadow", "spin.coll.elem_count", "spin.coll.epoch",
    "spin.coll.aux", "data.len",
]

M_1234 = "0x0000000000001234"
ID_2A = "0x000000000000002a"
NO_COLL = [""] * 7

# Expected values per frame for FIELDS[1:] (frame.time_epoch first). "" = field absent.
EXPECTED = {
    1: ["1700000000.000000000", "1", "1", "0x0001", "1", "0", "0", "0", "1", M_1234, ID_2A, "0", "1024", "2048", "0"] + NO_COLL + ["1024"],
    2: ["1700000000.001000001", "1", "1", "0x0002", "0", "1", "0", "0", "1", M_1234, ID_2A, "1", "1024", "2048", "1024"] + NO_COLL + ["1024"],
    3: ["1700000000.002000002", "1", "1", "0x001b", "1", "1", "0", "1", "3", "0xfeedface00000001", "0x0000000000000100", "0", "64", "64", "0",
        "1", "3", "5", "1", "16", "9", "0x00000000", "64"],
    4: ["1700000000.003000003", "1", "1", "0x0006", "0", "1", "1", "0", "1", M_1234, ID_2A, "1", "1024", "2048", "1024"] + NO_COLL + ["1024"],
    5: ["1700000000.004000004", "1", "2", "0x0000", "0", "0", "0", "0", "2", "0x0000000000000000", ID_2A, "1", "0", "0", "0"] + NO_COLL + [""],
    6: ["1700000000.005000005", "1", "3", "0x0000", "0", "0", "0", "0", "2", "0x0000000000000000", ID_2A, "1", "0", "0", "0"] + NO_COLL + [""],
    7: ["1700000000.006000006", "1", "4", "0x0003", "1", "1", "0", "0", "1", M_1234, ID_2A, "0", "8", "8", "0"] + NO_COLL + ["8"],
    8: ["1700000000.007000007", "1", "5", "0x0000", "0", "0", "0", "0", "1", M_1234, ID_2A, "0", "0", "0", "0"] + NO_COLL + [""],
    # Truncated: only the fields that fit in the 20 bytes there are.
    9: ["1700000000.008000008", "1", "1", "0x0001", "1", "0", "0", "0", "1", M_1234, "", "", "", "", ""] + NO_COLL + [""],
    # Unknown version: the version, then the rest as data.
    10: ["1700000000.009000009", "2", "", "", "", "", "", "", "", "", "", "", "", "", ""] + NO_COLL + ["53"],
    11: ["1700000000.010000010", "1", "1", "0x0003", "1", "1", "0", "0", "1", M_1234, ID_2A, "0", "100", "100", "0"] + NO_COLL + ["8"],
    12: ["1700000000.011000011", "1", "9", "0x0061", "1", "0", "0", "0", "1", M_1234, ID_2A, "0", "0", "0", "0"] + NO_COLL + [""],
    # UDP port 9999: not spin; the UDP payload goes to the data dissector.
    13: ["1700000000.012000012", "", "", "", "", "", "", "", "", "", "", "", "", "", ""] + NO_COLL + ["50"],
}

EXPECTED_INFO = {
    1: "spin data seq=0 src=1 msg=0x2a len=1024 [start]",
    2: "spin data seq=1 src=1 msg=0x2a len=1024 [end]",
    3: "spin data seq=0 src=3 msg=0x100 len=64 op=1 dtype=3 slot=5 shadow epoch=9 tag=0x123456789abcdef [start,end,coll,auth]",
    4: "spin data seq=1 src=1 msg=0x2a len=1024 [end,retransmit]",
    5: "spin ack seq=1 src=2 msg=0x2a len=0",
    6: "spin nack seq=1 src=2 msg=0x2a len=0",
    7: "spin result seq=0 src=1 msg=0x2a len=8 [start,end]",
    8: "spin control seq=0 src=1 msg=0x2a len=0",
    9: "spin [truncated header: 20 of 46 bytes]",
    10: "spin [unknown version 2]",
    11: "spin data seq=0 src=1 msg=0x2a len=100 [start,end] [Malformed: length mismatch]",
    12: "spin unknown(9) seq=0 src=1 msg=0x2a len=0 [start,unknown 0x0060] [Malformed: unknown type, unknown flags]",
    13: "17771 \u2192 9999 Len=50",
}

# Spin expert infos each frame must carry (all others must be absent).
EXPECTED_EXPERTS = {
    9: {"spin_truncated"},
    10: {"bad_version"},
    11: {"length_mismatch"},
    12: {"bad_type", "bad_flags"},
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Tshark:
    """Runs tshark with the dissector loaded; as root, falls back to user nobody when this
    Wireshark's init.lua refuses user Lua scripts to the superuser."""

    def __init__(self, lua):
        self.exe = shutil.which("tshark")
        if self.exe is None:
            die("tshark is not installed: install it (Debian/Ubuntu: apt-get install tshark; CI installs it)")
        self.lua = lua
        self.prefix = []
        if self.lua_loads():
            return
        if os.geteuid() == 0 and shutil.which("setpriv"):
            nobody = pwd.getpwnam("nobody")
            self.prefix = ["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid, "--clear-groups",
                           "env", "HOME=" + tempfile.gettempdir()]
            if self.lua_loads():
                print("note: this tshark runs no user Lua scripts as root (init.lua: run_user_scripts_when_superuser); "
                      "running it as user nobody", file=sys.stderr)
                return
        die("tshark does not load %s: %s\nSee tools/README.md (Lua and root)." % (lua, self.last_err.strip()))

    def lua_loads(self):
        # -G must come first on tshark's command line.
        r = subprocess.run(self.prefix + [self.exe, "-G", "protocols", "-X", "lua_script:" + self.lua],
                           capture_output=True, text=True)
        self.last_err = r.stderr
        return r.returncode == 0 and any(line.split("\t")[-1:] == ["spin"] for line in r.stdout.splitlines())

    def run(self, *args):
        cmd = self.prefix + [self.exe, "-n", "-X", "lua_script:" + self.lua] + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            die("%s exited with %d:\n%s" % (" ".join(cmd), r.returncode, r.stderr))
        if "Lua" in r.stderr and "rror" in r.stderr:
            die("Lua error in %s:\n%s" % (self.lua, r.stderr))
        return r.stdout


def fields(tshark, cap, names, *extra):
    args = ["-r", cap, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=|"]
    for n in names:
        args += ["-e", n]
    out = tshark.run(*(list(extra) + args))
    rows = {}
    for line in out.splitlines():
        cols = line.split("\t")
        check(len(cols) == len(names), "row has %d columns, want %d: %r" % (len(cols), len(names), line))
        rows[int(cols[0])] = cols[1:]
    return rows


def main():
    if len(sys.argv) != 3:
        die("usage: tshark_test.py <make_capture> <spin.lua>")
    make_capture, lua = sys.argv[1], os.path.abspath(sys.argv[2])
    tshark = Tshark(lua)

    with tempfile.TemporaryDirectory(prefix="spin-tshark-") as tmp:
        os.chmod(tmp, 0o755)  # readable by nobody in the root fallback
        cap = os.path.join(tmp, "cap.pcap")
        r = subprocess.run([make_capture, cap], capture_output=True, text=True)
        if r.returncode != 0:
            die("make_capture failed: " + r.stderr)
        os.chmod(cap, 0o644)
        verdicts = {int(n): v for n, v in (line.split() for line in r.stdout.splitlines())}
        check(sorted(verdicts) == sorted(EXPECTED), "make_capture wrote frames %s" % sorted(verdicts))

        # 1. Exact field values per frame.
        rows = fields(tshark, cap, FIELDS)
        check(sorted(rows) == sorted(EXPECTED), "tshark read frames %s" % sorted(rows))
        for n, want in EXPECTED.items():
            got = rows.get(n)
            if got is None:
                continue
            for name, g, w in zip(FIELDS[1:], got, want):
                check(g == w, "frame %d: %s = %r, want %r" % (n, name, g, w))

        # 2. Info column.
        info = fields(tshark, cap, ["frame.number", "_ws.col.Info"])
        for n, want in EXPECTED_INFO.items():
            got = info.get(n, ["<missing>"])[0]
            check(got == want, "frame %d: Info %r, want %r" % (n, got, want))

        # 3. Expert info: exactly the expected spin experts, all in group Malformed; and they agree
        # with the runtime's parser (wire::parse) on which frames it rejects and why.
        expert_cols = ["frame.number"] + ["spin." + r for r in SPIN_REASONS] + ["_ws.expert.group", "_ws.malformed"]
        ex = fields(tshark, cap, expert_cols)
        for n in EXPECTED:
            cols = ex.get(n, [""] * (len(expert_cols) - 1))
            present = {r for r, c in zip(SPIN_REASONS, cols) if c != ""}
            want = EXPECTED_EXPERTS.get(n, set())
            check(present == want, "frame %d: spin expert infos %s, want %s" % (n, sorted(present), sorted(want)))
            groups = [g for g in cols[len(SPIN_REASONS)].split("|") if g]
            check(all(int(g, 0) == PI_MALFORMED for g in groups) and len(groups) == len(want),
                  "frame %d: expert groups %s, want %d x Malformed" % (n, groups, len(want)))
            # Malformed-group expert infos make the frame match Wireshark's usual "_ws.malformed" filter.
            check((cols[len(SPIN_REASONS) + 1] != "") == bool(want), "frame %d: _ws.malformed is %r" % (n, cols[len(SPIN_REASONS) + 1]))
            v = verdicts.get(n)
            if v == "ok":
                check(not present, "frame %d: parser accepts it, dissector flags %s" % (n, sorted(present)))
            elif v in SPIN_REASONS:
                check(v in present, "frame %d: parser rejects it as %s, dissector flags %s" % (n, v, sorted(present)))
            else:
                check(v == "wrong_port" and n == 13, "frame %d: unexpected parser verdict %s" % (n, v))

        # 4. The expert summary (-z expert) lists the malformed frames as errors of protocol SPIN.
        summary = tshark.run("-r", cap, "-q", "-z", "expert")
        want_errors = sum(len(v) for v in EXPECTED_EXPERTS.values())
        check("Errors (%d)" % want_errors in summary, "-z expert: no 'Errors (%d)' in\n%s" % (want_errors, summary))
        spin_lines = [line for line in summary.splitlines() if " SPIN " in line and "Malformed" in line]
        check(len(spin_lines) == want_errors, "-z expert: %d SPIN Malformed lines, want %d" % (len(spin_lines), want_errors))

        # 5. Display filter on the protocol: frames 1-12 are spin, 13 is not.
        spin_frames = tshark.run("-r", cap, "-Y", "spin", "-T", "fields", "-e", "frame.number").split()
        check(spin_frames == [str(n) for n in range(1, 13)], "-Y spin selects %s" % spin_frames)

        # 6. The port preference: on port 9999 only frame 13 is spin, and it is a valid data packet.
        moved = fields(tshark, cap, ["frame.number", "spin.type", "spin.seq", "spin.payload_len", "spin.flags"],
                       "-o", "spin.udp_port:9999")
        for n in EXPECTED:
            want = ["1", "0", "4", "0x0003"] if n == 13 else ["", "", "", ""]
            check(moved.get(n) == want, "udp_port 9999: frame %d is %s, want %s" % (n, moved.get(n), want))

    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        sys.exit(1)
    print("tshark_dissector: %d frames checked with %s" % (len(EXPECTED), tshark.exe))


if __name__ == "__main__":
    main()
