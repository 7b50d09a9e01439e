package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/berthmq/berth/journal"
)

// faultWriteDelayEnv names a fault-injection setting for tests that run
// berthd as a real process: every write to the journals' files sleeps this
// long first, as on a slow or overloaded disk. It widens the window in which
// a record is appended but not yet written, so a kill -9 there shows what
// the broker promised about unwritten records. Not for production.
const faultWriteDelayEnv = "BERTH_FAULT_JOURNAL_WRITE_DELAY"

// faultJournalFS returns the journal file system the fault-injection
// settings ask for, or nil for the real one.
func faultJournalFS(log *slog.Logger) (journal.FS, error) {
	v := os.Getenv(faultWriteDelayEnv)
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, fmt.Errorf("%s=%q: want a non-negative duration such as 50ms", faultWriteDelayEnv, v)
	}
	log.Warn("berthd: fault injection: every journal write is delayed", "env", faultWriteDelayEnv, "delay", d.String())
	f := journal.NewFaultFS(nil)
	f.SetRule(func(op journal.Op, _ string, _ int) error {
		if op == journal.OpWrite {
			time.Sleep(d)
		}
		return nil
	})
	return f, nil
}
