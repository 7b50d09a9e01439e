package bench

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/perf/driver"
)

func parse(t *testing.T, args ...string) (Workload, error) {
	t.Helper()
	w := DefaultWorkload()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	w.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return w, err
	}
	return w, w.Validate()
}

func TestWorkloadFlags(t *testing.T) {
	w, err := parse(t, "--producers", "4", "--consumers", "3", "--queues", "3", "--size", "4KiB",
		"--mode", "batch:32", "--credit", "100", "--ack", "none", "--persistent", "--rate", "20k",
		"--count", "1M", "--duration", "0", "--warmup", "500ms")
	if err != nil {
		t.Fatal(err)
	}
	want := Workload{Producers: 4, Consumers: 3, Queues: 3, QueuePrefix: "berth-bench", Size: 4096, Mode: ModeBatch,
		Window: 256, Batch: 32, Credit: 100, Ack: driver.AckNone, Persistent: true, Rate: 20000,
		Count: 1_000_000, Warmup: 500 * time.Millisecond}
	if w != want {
		t.Fatalf("parsed\n%+v\nwant\n%+v", w, want)
	}
	if got := w.InFlight(); got != 32 {
		t.Fatalf("InFlight = %d, want the batch 32", got)
	}
	if got := w.QueueNames(); strings.Join(got, ",") != "berth-bench-0,berth-bench-1,berth-bench-2" {
		t.Fatalf("QueueNames = %v", got)
	}
}

func TestWorkloadModes(t *testing.T) {
	for _, tc := range []struct {
		arg      string
		mode     Mode
		inFlight int
	}{{"sync", ModeSync, 1}, {"async", ModeAsync, 256}, {"async:1000", ModeAsync, 1000}, {"batch", ModeBatch, 64}} {
		w, err := parse(t, "--mode", tc.arg)
		if err != nil {
			t.Fatalf("%s: %v", tc.arg, err)
		}
		if w.Mode != tc.mode || w.InFlight() != tc.inFlight {
			t.Fatalf("%s: mode %s in flight %d, want %s %d", tc.arg, w.Mode, w.InFlight(), tc.mode, tc.inFlight)
		}
	}
}

func TestWorkloadRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--mode", "turbo"},
		{"--mode", "sync:3"},
		{"--mode", "async:0"},
		{"--mode", "async:x"},
		{"--size", "8"},           // no room for the timestamp
		{"--size", "17MiB"},       // above sizeMax
		{"--size", "-1"},          //
		{"--ack", "maybe"},        //
		{"--rate", "-5"},          //
		{"--rate", "fast"},        //
		{"--count", "1.5"},        // not whole
		{"--producers", "0"},      //
		{"--producers", "5000"},   // above producersMax
		{"--queues", "0"},         //
		{"--window", "100000"},    // above windowMax
		{"--credit", "0"},         //
		{"--duration", "0"},       // neither duration nor count
		{"--queue-prefix", "a.b"}, // nats subjects would split it
		{"--duration", "-1s"},     //
		{"--warmup", "-1s"},       //
		{"--consumers", "-1"},     //
		{"--credit", "70000"},     //
		{"--batch", "0"},          //
		{"--duration", "48h"},     // above durationMax
		{"--queue-prefix", ""},    //
		{"--queue-prefix", "a b"}, //
		{"--queue-prefix", "a>"},  //
		{"--queue-prefix", "a*"},  //
		{"--producers", "-3"},     //
		{"--count", "-1"},         //
		{"--size", "12k"},         // fine size, but check it parses: not rejected
	} {
		_, err := parse(t, args...)
		if args[0] == "--size" && args[1] == "12k" {
			if err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

func TestParseSizeAndRate(t *testing.T) {
	sizes := map[string]int{"16": 16, "1KiB": 1024, "2k": 2048, "1MiB": 1 << 20, "3MB": 3 << 20, "100B": 100}
	for in, want := range sizes {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	rates := map[string]float64{"0": 0, "1500": 1500, "2.5k": 2500, "1M": 1e6}
	for in, want := range rates {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "k", "1e400", "NaN", "-1"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
}

func TestWorkloadString(t *testing.T) {
	w := DefaultWorkload()
	w.Rate = 5000
	got := w.String()
	want := "p=2 c=2 q=1 size=1024 mode=async:256 credit=256 ack=explicit persistent=false rate=5000/s"
	if got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

// A count given alone is the whole run: the default duration does not cut
// it short and the default warm-up does not add to it.
func TestCountAlone(t *testing.T) {
	def := DefaultWorkload()
	for _, tc := range []struct {
		args             []string
		duration, warmup time.Duration
	}{
		{[]string{"--count", "500"}, 0, 0},
		{[]string{"--count", "2k", "--duration", "5s"}, 5 * time.Second, 0},
		{[]string{"--count", "500", "--warmup", "1s"}, 0, time.Second},
		{[]string{"--duration", "3s"}, 3 * time.Second, def.Warmup},
		{[]string{"--count", "0", "--duration", "3s"}, 3 * time.Second, def.Warmup},
		{nil, def.Duration, def.Warmup},
	} {
		w := DefaultWorkload()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		w.RegisterFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		w.CountAlone(fs)
		if err := w.Validate(); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if w.Duration != tc.duration || w.Warmup != tc.warmup {
			t.Errorf("%v: duration %v warm-up %v, want %v and %v", tc.args, w.Duration, w.Warmup, tc.duration, tc.warmup)
		}
	}
}
