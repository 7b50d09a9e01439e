package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/berthmq/berth/journal"
)

// Queues that stay local in a cluster. A durable queue declared before
// "berthctl cluster init" lives on the broker that declared it, in its
// shard journal, not in a replication group. Whether a queue is
// replicated was decided anew at every restart, from the group count at
// that time: after the init, a restart made such a queue replicated, and
// its messages, which no group log held, were gone
// (TestQueueBeforeInitSurvivesRestart).
//
// So a broker that runs replication groups (-peer) writes down each
// durable queue it creates while the cluster has no groups, and keeps
// the queues on that list local from then on; deleting one takes it off.
// The list is a log of records, op u8 ('+' or '-'), name length u16,
// name, appended and fsynced before the declare is answered (the wiring
// restore at start writes its records in one batch); a torn last record
// is ignored, and the log is rewritten at start when removals have made
// it more than twice as long as the list. A broker without -peer keeps
// no list.
const localQueuesFile = "local-queues"

// foreignQueuesFile lists, in the same format, the queues other brokers
// keep local: queues this broker saw in the controller's wiring while
// the cluster had no groups (server/wiringsync.go). It restores none of
// them, brings none in, and refuses to declare one, so each stays on the
// broker that declared it. A name leaves the list when the controller no
// longer holds it.
const foreignQueuesFile = "foreign-queues"

// The lists as the rest of the broker asks them; each method is safe
// from any goroutine.

// IsLocal reports whether name is a durable queue this broker keeps out
// of the groups (localQueuesFile).
func (r *Replicator) IsLocal(name string) bool { return r.local.has(name) }

// RemoveLocal takes a deleted queue off the list of local queues,
// durably, so that a queue of its name declared later may be replicated.
func (r *Replicator) RemoveLocal(name string) error { return r.local.remove(name) }

// IsForeign reports whether name is another broker's local queue
// (foreignQueuesFile).
func (r *Replicator) IsForeign(name string) bool { return r.foreign.has(name) }

// AddForeign puts name on the list of other brokers' local queues,
// durably.
func (r *Replicator) AddForeign(name string) error {
	r.foreign.add(name)
	return r.foreign.flush()
}

// ForeignLen is the number of other brokers' local queues listed.
func (r *Replicator) ForeignLen() int { return r.foreign.len() }

// RemoveForeignMissing takes off the list of other brokers' local queues,
// durably, every name held says the controller no longer holds.
func (r *Replicator) RemoveForeignMissing(held func(name string) bool) error {
	return r.foreign.removeMissing(held)
}

type localQueues struct {
	dir  string // "" keeps the list in memory only
	file string // localQueuesFile or foreignQueuesFile
	mu   sync.Mutex
	set  map[string]struct{}
	f    *os.File // the log, open for appends; nil until the first
	buf  []byte   // records not written yet
}

func loadLocalQueues(dir string) (*localQueues, error) { return loadQueueList(dir, localQueuesFile) }

func loadQueueList(dir, file string) (*localQueues, error) {
	l := &localQueues{dir: dir, file: file, set: map[string]struct{}{}}
	if dir == "" {
		return l, nil
	}
	path := filepath.Join(dir, file)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("replication: read %s: %w", path, err)
	}
	records := 0
	for len(data) >= 3 {
		op, n := data[0], int(binary.BigEndian.Uint16(data[1:3]))
		if len(data) < 3+n {
			break // torn by a crash mid-append
		}
		name := string(data[3 : 3+n])
		switch op {
		case '+':
			l.set[name] = struct{}{}
		case '-':
			delete(l.set, name)
		default:
			return nil, fmt.Errorf("replication: %s is corrupt: record %d has op %#x", path, records, op)
		}
		data = data[3+n:]
		records++
	}
	if records > 2*len(l.set) || len(data) > 0 {
		// Rewrite: the live names only, and no torn tail to append after.
		for _, name := range slices.Sorted(func(yield func(string) bool) {
			for n := range l.set {
				if !yield(n) {
					return
				}
			}
		}) {
			l.buf = appendLocalRecord(l.buf, '+', name)
		}
		if err := journal.WriteFileDurable(dir, file, l.buf); err != nil {
			return nil, fmt.Errorf("replication: rewrite %s: %w", path, err)
		}
		l.buf = l.buf[:0]
	}
	return l, nil
}

func appendLocalRecord(b []byte, op byte, name string) []byte {
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// A nil list is empty and takes no names.
func (l *localQueues) has(name string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.set[name]
	return ok
}

// removeMissing takes off the list, durably, every name keep says is
// gone.
func (l *localQueues) removeMissing(keep func(name string) bool) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for name := range l.set {
		if !keep(name) {
			delete(l.set, name)
			if l.dir != "" {
				l.buf = appendLocalRecord(l.buf, '-', name)
			}
		}
	}
	if l.dir == "" {
		return nil
	}
	return l.flushLocked()
}

func (l *localQueues) len() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.set)
}

// add puts name on the list; flush makes it durable.
func (l *localQueues) add(name string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.set[name]; ok {
		return
	}
	l.set[name] = struct{}{}
	if l.dir != "" {
		l.buf = appendLocalRecord(l.buf, '+', name)
	}
}

// remove takes name off the list, if it is on it, durably.
func (l *localQueues) remove(name string) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.set[name]; !ok {
		return nil
	}
	delete(l.set, name)
	if l.dir == "" {
		return nil
	}
	l.buf = appendLocalRecord(l.buf, '-', name)
	return l.flushLocked()
}

// flush writes and fsyncs the records added since the last flush.
func (l *localQueues) flush() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flushLocked()
}

func (l *localQueues) flushLocked() error {
	if len(l.buf) == 0 {
		return nil
	}
	if l.f == nil {
		if err := os.MkdirAll(l.dir, 0o755); err != nil {
			return err
		}
		path := filepath.Join(l.dir, l.file)
		_, statErr := os.Stat(path)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		if errors.Is(statErr, fs.ErrNotExist) {
			if err := (journal.OSFS{}).SyncDir(l.dir); err != nil {
				f.Close()
				return err
			}
		}
		l.f = f
	}
	if _, err := l.f.Write(l.buf); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil {
		return err
	}
	l.buf = l.buf[:0]
	return nil
}

// close closes the log.
func (l *localQueues) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
