"""Durable shared subscriptions (seed 001), sans-I/O.

`$share/GROUP/FILTER` and `$queue/FILTER`: a cluster-unique Leader lends the
streams of the filter to the Borrowers of the group's sessions and keeps their
progress. The pieces, from the session down:

- `handler.SharedSubscriptionHandler`: the session's facade (subscribe,
  unsubscribe, what was fetched and acknowledged);
- `agent.Agent`: a session's Borrowers, one per subscription, recreated when
  invalidated;
- `borrower.Borrower`: one subscription's state machine;
- `leader.Leader`: one group's state machine (streams, Borrowers, assignments,
  allocation, progress);
- `protocol`: the messages between Borrowers and Leaders (seed 001's names);
- `bus`: how they travel (`Bus`, `InProcessBus`) and the node-local `Registry`;
- `claims.GroupStore`: the leader claim and the persisted group state;
- `config.SharedSubConfig`: the timers.

The runtime that owns the clock, the bus and storage, and executes the
effects: `runtime.SharedRuntime` on the broker's event loop, `host.LeaderHost`
(a node's Leaders over storage) and `cluster.bus` (the bus between nodes on
PostgreSQL); docs/shared-subscriptions.md tells the whole story.
"""
