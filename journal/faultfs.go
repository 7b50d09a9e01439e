package journal

import (
	"errors"
	"io/fs"
	"sync"
)

// Op names a kind of file-system operation that a FaultFS can fail.
type Op uint8

const (
	OpOpen Op = iota
	OpWrite
	OpReadAt
	OpSync
	OpTruncate
	OpRemove
	OpRename
	OpSyncDir
	OpReadDir
	OpMkdirAll
	opCount
)

var opNames = [opCount]string{"open", "write", "readat", "sync", "truncate", "remove", "rename", "syncdir", "readdir", "mkdirall"}

func (o Op) String() string {
	if o < opCount {
		return opNames[o]
	}
	return "op?"
}

// ErrInjected is the error a FaultFS returns unless a rule supplies its own.
var ErrInjected = errors.New("journal: injected I/O error")

// FaultRule decides whether an operation fails. n counts the operations of
// kind op seen so far, this one included (1-based). A nil error lets the
// operation through.
type FaultRule func(op Op, name string, n int) error

// FaultFS wraps a real FS and fails the operations its rule picks. A failed
// Write writes the first half of its bytes before failing, so a torn
// record is left behind as after a crash. It is safe for concurrent use.
type FaultFS struct {
	inner FS

	mu struct {
		sync.Mutex
		counts [opCount]int
		rule   FaultRule
	}
}

// NewFaultFS wraps inner (nil means OSFS).
func NewFaultFS(inner FS) *FaultFS {
	if inner == nil {
		inner = OSFS{}
	}
	return &FaultFS{inner: inner}
}

// SetRule replaces the rule; nil lets everything through.
func (f *FaultFS) SetRule(rule FaultRule) {
	f.mu.Lock()
	f.mu.rule = rule
	f.mu.Unlock()
}

// FailNth fails the nth operation of kind op counted from now (1-based),
// and only that one.
func (f *FaultFS) FailNth(op Op, n int) {
	f.mu.Lock()
	base := f.mu.counts[op]
	f.mu.rule = func(o Op, _ string, c int) error {
		if o == op && c == base+n {
			return ErrInjected
		}
		return nil
	}
	f.mu.Unlock()
}

// Count reports how many operations of kind op were attempted.
func (f *FaultFS) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.counts[op]
}

func (f *FaultFS) check(op Op, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.counts[op]++
	if f.mu.rule == nil {
		return nil
	}
	return f.mu.rule(op, name, f.mu.counts[op])
}

func (f *FaultFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	if err := f.check(OpOpen, name); err != nil {
		return nil, err
	}
	file, err := f.inner.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{fs: f, name: name, inner: file}, nil
}

func (f *FaultFS) Remove(name string) error {
	if err := f.check(OpRemove, name); err != nil {
		return err
	}
	return f.inner.Remove(name)
}

func (f *FaultFS) Rename(oldName, newName string) error {
	if err := f.check(OpRename, oldName); err != nil {
		return err
	}
	return f.inner.Rename(oldName, newName)
}

func (f *FaultFS) MkdirAll(dir string, perm fs.FileMode) error {
	if err := f.check(OpMkdirAll, dir); err != nil {
		return err
	}
	return f.inner.MkdirAll(dir, perm)
}

func (f *FaultFS) ReadDir(dir string) ([]string, error) {
	if err := f.check(OpReadDir, dir); err != nil {
		return nil, err
	}
	return f.inner.ReadDir(dir)
}

func (f *FaultFS) SyncDir(dir string) error {
	if err := f.check(OpSyncDir, dir); err != nil {
		return err
	}
	return f.inner.SyncDir(dir)
}

type faultFile struct {
	fs    *FaultFS
	name  string
	inner File
}

func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.check(OpWrite, f.name); err != nil {
		n, _ := f.inner.Write(p[:len(p)/2])
		return n, err
	}
	return f.inner.Write(p)
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.check(OpReadAt, f.name); err != nil {
		return 0, err
	}
	return f.inner.ReadAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.check(OpSync, f.name); err != nil {
		return err
	}
	return f.inner.Sync()
}

func (f *faultFile) Truncate(size int64) error {
	if err := f.fs.check(OpTruncate, f.name); err != nil {
		return err
	}
	return f.inner.Truncate(size)
}

func (f *faultFile) Size() (int64, error) { return f.inner.Size() }
func (f *faultFile) Close() error         { return f.inner.Close() }
