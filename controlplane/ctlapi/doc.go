// Package ctlapi is the API of Berth's controller: what a client asks the
// controller for, what it reads back, and how both are encoded.
//
//   - Write events (events.go): every change to the controller's state is
//     one Event, checked by ValidateEvent and encoded by EncodeEvent. Events
//     are stored in the raft log: an EventKind is never renumbered and an
//     event's encoding never changes.
//   - Records (records.go): brokers, groups, wiring, the cluster
//     configuration, read modes and the Result of applying an event. The
//     controller's snapshots store them in the same encodings.
//   - The service protocol (protocol.go): operations, read queries, reply
//     statuses and the bodies they carry in wire.CtlRequest and
//     wire.CtlResponse frames. Brokers of different versions speak it:
//     never renumber an operation, a query or a status.
//   - Errors (errors.go): the controller's answers other than a Result.
//
// Everything is written with the wire package's codec (codec.go adds the
// controller's string bound). The package does no I/O and needs nothing of
// Berth but wire, so whoever only talks to controllers (package ctlclient:
// brokers, berthctl, benchmarks) links neither raft nor pebble. The
// controller itself (package controlplane) imports this package, never the
// other way.
package ctlapi
