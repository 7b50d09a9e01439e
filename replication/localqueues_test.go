package replication

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestLocalQueuesLog: the list survives a reload, removals stay removed,
// a torn last record is dropped (and the log rewritten so that appends
// go on after whole records), and a log of mostly removals is compacted.
func TestLocalQueuesLog(t *testing.T) {
	dir := t.TempDir()
	l, err := loadLocalQueues(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c", "q with spaces\nand a newline"} {
		l.add(n)
	}
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.remove("b"); err != nil {
		t.Fatal(err)
	}
	l.close()
	path := filepath.Join(dir, localQueuesFile)
	// A crash mid-append: half a record at the end.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(appendLocalRecord(nil, '+', "torn")[:4]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err = loadLocalQueues(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a": true, "b": false, "c": true, "q with spaces\nand a newline": true, "torn": false} {
		if l.has(name) != want {
			t.Errorf("after a reload: has(%q) = %v, want %v", name, !want, want)
		}
	}
	l.add("d")
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "c", "q with spaces\nand a newline"} {
		if err := l.remove(n); err != nil {
			t.Fatal(err)
		}
	}
	l.close()
	before, _ := os.Stat(path)
	l, err = loadLocalQueues(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	after, _ := os.Stat(path)
	if !l.has("d") || l.len() != 1 {
		t.Fatalf("after removals: %d names, has d %v; want d alone", l.len(), l.has("d"))
	}
	if after.Size() >= before.Size() || after.Size() != int64(len(appendLocalRecord(nil, '+', "d"))) {
		t.Fatalf("the log of mostly removals was not compacted: %d bytes, then %d", before.Size(), after.Size())
	}
	if err := os.WriteFile(path, []byte{'x', 0, 1, 'y'}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadLocalQueues(dir); err == nil {
		t.Fatal("a log with an unknown op loaded")
	}
}

// TestOwnQueueLeavesForeignList: a name on both lists (a wiring pass once
// wrote this broker's own declare down as another broker's) is taken off
// the foreign list at start, durably, and so is one this broker keeps
// local later (keepLocal); the others' names stay.
func TestOwnQueueLeavesForeignList(t *testing.T) {
	dir := t.TempDir()
	local, err := loadLocalQueues(dir)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := loadQueueList(dir, foreignQueuesFile)
	if err != nil {
		t.Fatal(err)
	}
	local.add("mine")
	foreign.add("mine")
	foreign.add("theirs")
	foreign.add("later")
	if err := local.flush(); err != nil {
		t.Fatal(err)
	}
	if err := foreign.flush(); err != nil {
		t.Fatal(err)
	}
	if err := ownOffForeign(local, foreign); err != nil {
		t.Fatal(err)
	}
	r := &Replicator{local: local, foreign: foreign, log: slog.New(slog.DiscardHandler)}
	r.keepLocal("later")
	local.close()
	foreign.close()
	foreign, err = loadQueueList(dir, foreignQueuesFile)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.close()
	if foreign.has("mine") || foreign.has("later") || !foreign.has("theirs") {
		t.Fatalf("foreign after a reload: mine %v, later %v, theirs %v; want false, false, true", foreign.has("mine"), foreign.has("later"), foreign.has("theirs"))
	}
}
