"""One client's session taken over between two broker nodes 1,000 times, under
a QoS 1 and a QoS 2 stream (docs/broker.md, "Several nodes").

    python bench/takeover.py [--takeovers 1000] [--qos 1,2] [--pace 0.002]

Starts a PostgreSQL server (tests/harness/postgres.py) and two `riverbed
serve` nodes on it with their default timings. A publisher on the first node
publishes numbered messages at the chosen QoS (one at a time, `--pace` seconds
apart) while the roaming client's session is taken alternately by a new
connection to the other node (`tests/harness/takeover.py`), each waiting for a
delivery before the next takes over. Checked, and printed per stream: no
message delivered to a connection after its successor's CONNACK, every old
connection closed with 0x8E by then, nothing lost, for QoS 2 nothing
delivered twice; with the takeovers' rate and CONNECT-to-CONNACK latency.
Exits 1 if a check fails. No peer: the numbers are Riverbed's own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness.broker import BrokerProcess
from harness.postgres import PostgresServer
from harness.takeover import Takeovers


def run(url: str, takeovers: int, qos: int, pace: float) -> bool:
    with BrokerProcess(url) as a, BrokerProcess(url) as b:
        stream = Takeovers([a.port, b.port], qos=qos, client_id=f"roaming-{qos}", pace=pace)
        started = time.monotonic()
        try:
            stream.start()
            for i in range(1, takeovers + 1):
                stream.take_over(b.port if i % 2 else a.port)
            elapsed = time.monotonic() - started
            stream.finish()
        except BaseException:
            for name, node in (("first", a), ("second", b)):
                print(f"-- the {name} node's log:\n{node.tail(80)}", file=sys.stderr)
            raise
        finally:
            stream.close()
        problems = [
            line
            for node in (a, b)
            for line in node.log_path.read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line
        ]
    latencies = sorted(stream.takeover_seconds())
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    checks = {
        "deliveries after the successor's CONNACK": stream.overlaps(),
        "old connections not closed with 0x8E": stream.not_taken_over(),
        "messages lost": stream.missing(),
        "messages delivered twice": stream.duplicates() if qos == 2 else [],
    }
    print(
        f"QoS {qos}: {takeovers} takeovers in {elapsed:.1f} s ({takeovers / elapsed:.1f}/s),"
        f" CONNECT to CONNACK p50 {statistics.median(latencies) * 1000:.1f} ms"
        f" p99 {p99 * 1000:.1f} ms; {stream.published} messages published,"
        f" {len(stream.deliveries)} deliveries ({len(stream.duplicates())} repeated)"
    )
    for line in problems[:20]:
        print(f"  logged: {line}")
    ok = True
    for what, found in checks.items():
        print(f"  {what}: {len(found)}")
        for line in found[:10]:
            print(f"    {line}")
        ok = ok and not found
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takeovers", type=int, default=1000)
    parser.add_argument("--qos", default="1,2", help="the streams' QoS, comma-separated")
    parser.add_argument("--pace", type=float, default=0.002, help="seconds between messages")
    args = parser.parse_args()
    server = PostgresServer()
    server.start()
    try:
        results = [
            run(server.new_database(f"bench_takeover_{qos}"), args.takeovers, int(qos), args.pace)
            for qos in args.qos.split(",")
        ]
    finally:
        server.stop()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
