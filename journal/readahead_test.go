package journal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
)

// TestReadAhead: records of many sizes (some larger than a window) over
// several segments, some still pending, read through a window in order,
// backwards and at random from another goroutine than the owner's, give
// what Read gives; a freed record is ErrNotFound through the window too,
// even while the window holds its bytes.
func TestReadAhead(t *testing.T) {
	j, _ := openT(t, Options{Dir: t.TempDir(), SegmentBytes: 1 << 20})
	defer j.Close()
	rng := rand.New(rand.NewSource(1))
	var pos []Pos
	var want [][]byte
	for i := range 600 {
		size := 1 + rng.Intn(4<<10)
		if i%97 == 0 {
			size = WindowBytes + rng.Intn(WindowBytes) // larger than a window
		}
		data := bytes.Repeat([]byte{byte(i)}, size)
		copy(data, fmt.Sprint(i))
		pos = append(pos, j.Append(data, func(Pos, error) {}))
		want = append(want, data)
		if i == 500 {
			if err := j.Sync(); err != nil { // the last 99 may still be pending
				t.Fatal(err)
			}
		}
	}
	check := func(w *Window, i int) {
		got, err := j.ReadAhead(pos[i], w, []byte("x"))
		if err != nil || !bytes.Equal(got[1:], want[i]) || got[0] != 'x' {
			t.Errorf("record %d: %d bytes, %v", i, len(got), err)
		}
	}
	var w Window
	for i := range pos {
		check(&w, i)
	}
	for i := len(pos) - 1; i >= 0; i-- {
		check(&w, i)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var w Window
		for _, i := range rand.New(rand.NewSource(2)).Perm(len(pos)) {
			check(&w, i)
		}
	}()
	wg.Wait()
	if err := j.Sync(); err != nil {
		t.Fatal(err)
	}
	check(&w, 10) // the window holds 10 and 11 now
	j.Free(pos[11])
	if _, err := j.ReadAhead(pos[11], &w, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a freed record read through the window: %v", err)
	}
}
