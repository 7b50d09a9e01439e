package journal

import (
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FS is the slice of a file system the journal uses. The real one is OSFS;
// tests wrap it in a FaultFS to inject I/O errors.
type FS interface {
	// OpenFile opens name with os.OpenFile flags.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Remove(name string) error
	Rename(oldName, newName string) error
	MkdirAll(dir string, perm fs.FileMode) error
	// ReadDir lists the names in dir.
	ReadDir(dir string) ([]string, error)
	// SyncDir makes creations, renames and removals in dir durable.
	SyncDir(dir string) error
}

// File is an open file. Sync must make the file's data (and its size)
// durable; it may use fdatasync.
type File interface {
	Write(p []byte) (int, error)
	ReadAt(p []byte, off int64) (int, error)
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// OSFS is the real operating-system file system.
type OSFS struct{}

type osFile struct{ f *os.File }

func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (OSFS) Remove(name string) error                    { return os.Remove(name) }
func (OSFS) Rename(oldName, newName string) error        { return os.Rename(oldName, newName) }
func (OSFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }

func (OSFS) ReadDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFileDurable replaces dir/name with data: a temporary file,
// fsynced, renamed over it, then the directory fsynced. It uses the OS's
// file system; the broker's small state files (its id, the lists of
// queues kept local) are written with it.
func WriteFileDurable(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return OSFS{}.SyncDir(dir)
}

func (f osFile) Write(p []byte) (int, error)             { return f.f.Write(p) }
func (f osFile) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }
func (f osFile) Truncate(size int64) error               { return f.f.Truncate(size) }
func (f osFile) Close() error                            { return f.f.Close() }

// Sync uses fdatasync: segment files only grow by appends, and fdatasync
// still flushes the size change, while it skips the mtime update that
// fsync would also force out.
func (f osFile) Sync() error {
	for {
		err := unix.Fdatasync(int(f.f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.f.Name(), Err: err}
			}
			return nil
		}
	}
}

func (f osFile) Size() (int64, error) {
	st, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}
