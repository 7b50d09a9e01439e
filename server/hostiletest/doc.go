// Package hostiletest plays hostile and broken clients against a real
// berthd process, one after another, and after each checks that the
// broker is still running, that a well-behaved client still gets its
// messages through within a bound, and that the process's RSS stays
// under a bound: frames that claim 4 GiB, logins that never finish,
// 10,000 connections held, connection churn, a consumer that never reads
// its socket, unaccepted deliveries and settles of tags never delivered,
// names at and past every length limit, topic patterns made to be slow
// to match, and a user flooding commands it may not run.
//
// The cases share one broker (started once: a process start costs a
// second) with short limits so that the timeouts show within the test:
// -handshake-timeout 2s, -outbound-max 1MiB, -outbound-timeout 2s. The
// permission case runs last: adding users ends the default user's
// logins.
package hostiletest
