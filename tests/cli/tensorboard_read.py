#!/usr/bin/python3
"""Reads loom's TensorBoard event files with a reader other than the writer: Python's protobuf
(Debian's python3-protobuf) over src/cli/tensorboard.proto compiled by protoc, and the crc32c
module for the TFRecord CRCs. Checks the framing (both masked CRC32C of every record), the first
event's file_version, and that the scalars are exactly the numbers of the --metrics file (as
float32), no more and no fewer. Files are read in name order (by creation time) as TensorBoard
does, and a SessionLog START at step S drops what was read of steps S and later (TensorBoard's
purge of orphaned data after a restart); a (tag, step) seen twice with different values fails.

usage: tensorboard_read.py EVENTS_DIR METRICS.jsonl PROTO_DIR WORK_DIR
"""
import glob, json, os, struct, subprocess, sys

import crc32c

events_dir, metrics, proto_dir, work = sys.argv[1:5]
subprocess.run(["protoc", f"--python_out={work}", "-I", proto_dir, "tensorboard.proto"], check=True)
sys.path.insert(0, work)
import tensorboard_pb2  # noqa: E402


def fail(msg):
    print(f"FAIL [tensorboard_read]: {msg}", file=sys.stderr)
    sys.exit(1)


def masked(data):
    c = crc32c.crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            fail(f"{path}: truncated record header at byte {at}")
        (n,) = struct.unpack_from("<Q", data, at)
        (len_crc,) = struct.unpack_from("<I", data, at + 8)
        if len_crc != masked(data[at:at + 8]):
            fail(f"{path}: length CRC mismatch at byte {at}")
        body = data[at + 12:at + 12 + n]
        if len(body) != n or at + 16 + n > len(data):
            fail(f"{path}: truncated record at byte {at}")
        (body_crc,) = struct.unpack_from("<I", data, at + 12 + n)
        if body_crc != masked(body):
            fail(f"{path}: data CRC mismatch at byte {at}")
        yield body
        at += 16 + n


files = sorted(glob.glob(os.path.join(events_dir, "events.out.tfevents.*")))
if not files:
    fail(f"no event files in {events_dir}")
got, events, restarts = {}, 0, 0
for path in files:
    for i, body in enumerate(records(path)):
        ev = tensorboard_pb2.Event()
        ev.ParseFromString(body)
        events += 1
        if i == 0:
            if ev.WhichOneof("what") != "file_version" or ev.file_version != "brain.Event:2":
                fail(f"{path}: first event is not file_version brain.Event:2: {ev}")
            continue
        if ev.WhichOneof("what") == "session_log" and ev.session_log.status == tensorboard_pb2.SessionLog.START:
            got = {k: v for k, v in got.items() if k[1] < ev.step}
            restarts += 1
            continue
        if ev.WhichOneof("what") != "summary" or ev.wall_time < 1e9:
            fail(f"{path}: event {i} is not a summary with a wall time: {ev}")
        for v in ev.summary.value:
            if v.WhichOneof("value") != "simple_value":
                fail(f"{path}: {v.tag} is not a simple value")
            if got.get((v.tag, ev.step), v.simple_value) != v.simple_value:
                fail(f"{path}: {v.tag} of step {ev.step} logged twice: {got[(v.tag, ev.step)]} and {v.simple_value}")
            got[(v.tag, ev.step)] = v.simple_value

want = {}
with open(metrics) as f:
    for line in f:
        rec = json.loads(line)
        if "step" not in rec:
            continue
        for k, v in rec.items():
            if k != "step":
                want[(k, rec["step"])] = struct.unpack("<f", struct.pack("<f", v))[0]

if set(got) != set(want):
    fail(f"scalars differ: only in events {sorted(set(got) - set(want))[:5]}, "
         f"only in metrics {sorted(set(want) - set(got))[:5]}")
for key, v in want.items():
    if got[key] != v:
        fail(f"{key}: events {got[key]!r}, metrics {v!r}")
tags = sorted({t for t, _ in got})
print(f"ok: {len(files)} event file(s), {events} events, {restarts} restart(s), {len(got)} scalars "
      f"({', '.join(tags)}) equal the metrics file")
