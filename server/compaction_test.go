package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// TestDiskUseFollowsLiveData publishes persistent messages and consumes
// them: the journal's disk use returns to near zero. With 1% never
// consumed it stays bounded near the live data.
func TestDiskUseFollowsLiveData(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 50_000
	}
	dir := t.TempDir()
	s := startServer(t, func(c *server.Config) {
		c.DataDir = dir
		c.Fsync = journal.FsyncNever // the test is about space, not durability
		c.JournalSegmentBytes = 1 << 20
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dial(t, s)
	for _, q := range []string{"all", "some"} {
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	payload := make([]byte, 128)
	run := func(queue string, keepEvery int) (written int64) {
		for i := 0; i < n; i++ {
			if err := c.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		con, err := c.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 4096, AutoCredit: true})
		if err != nil {
			t.Fatal(err)
		}
		var tags []uint64
		for i := 0; i < n; i++ {
			d, err := con.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if keepEvery > 0 && i%keepEvery == 0 {
				if err := d.Release(ctx); err != nil { // stays in the queue
					t.Fatal(err)
				}
				continue
			}
			tags = append(tags, d.Tag)
			if len(tags) == 512 {
				if err := con.Accept(ctx, tags...); err != nil {
					t.Fatal(err)
				}
				tags = tags[:0]
			}
		}
		if len(tags) > 0 {
			if err := con.Accept(ctx, tags...); err != nil {
				t.Fatal(err)
			}
		}
		if err := con.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		return int64(n) * int64(len(payload))
	}
	written := run("all", 0)
	checkFor(t, 30*time.Second, func() error {
		if b := dirBytes(t, dir); b > 4<<20 {
			return errorf("after consuming everything the data dir holds %d bytes (%d written)", b, written)
		}
		return nil
	})
	t.Logf("all consumed: %d bytes on disk after %d payload bytes written", dirBytes(t, dir), written)

	written += run("some", 100)
	live := int64(n/100) * 200 // 1% left, with record overhead
	checkFor(t, 30*time.Second, func() error {
		if b := dirBytes(t, dir); b > live+6<<20 {
			return errorf("with 1%% live (%d bytes) the data dir holds %d bytes", live, b)
		}
		return nil
	})
	st, _ := s.Broker().JournalStats()
	t.Logf("1%% kept: %d bytes on disk, %d segments reclaimed, %d compactions", dirBytes(t, dir), st.SegmentsReclaimed, st.Compactions)
}

func errorf(format string, args ...any) error { return &testErr{msg: fmt.Sprintf(format, args...)} }

type testErr struct{ msg string }

func (e *testErr) Error() string { return e.msg }
