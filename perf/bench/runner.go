package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/berthmq/berth/perf/driver"
)

// Defaults for Options.
const (
	progressIntervalDefault = time.Second
	// drainIdleDefault ends the wait for deliveries once none arrived for
	// this long after the producers finished.
	drainIdleDefault = 5 * time.Second
	// drainTimeoutDefault bounds the whole wait for deliveries and for the
	// last publish completions.
	drainTimeoutDefault = 30 * time.Second
	// timelineMax bounds the samples kept for the plot (a day at 1 s).
	timelineMax = 86400
	// cleanupTimeout bounds deleting the queues a run created.
	cleanupTimeout = 30 * time.Second
)

// Options are how a run is carried out, as opposed to what it does.
type Options struct {
	DriverName string
	Driver     driver.Driver
	Addrs      []string
	Label      string
	// Progress, if not nil, gets a line per interval; with ProgressCR the
	// line is rewritten in place (for a terminal).
	Progress   io.Writer
	ProgressCR bool
	Interval   time.Duration
	DrainIdle  time.Duration
	// DrainTimeout bounds waiting for completions and deliveries after the
	// producers stop.
	DrainTimeout time.Duration
	// Profiler, if not nil, is started when the measured phase begins and
	// finished when it ends.
	Profiler *Profiler
	// Reuse lets the run use queues that exist and hold messages (see
	// driver.SetupOptions); their messages are then consumed too.
	Reuse bool
	// Keep leaves the queues the run created in place; without it they
	// are deleted when it ends, however it ends. Queues the run did not
	// create are never deleted.
	Keep bool
}

// Payload layout: the send time (Unix ns, little endian) in bytes 0..8,
// then the producer id and its sequence number, for debugging.
const (
	payloadTimeOff = 0
	payloadSeqOff  = 8
)

// SendTime reads the send time a payload carries.
func SendTime(payload []byte) (time.Time, bool) {
	if len(payload) < sizeMin {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.LittleEndian.Uint64(payload[payloadTimeOff:]))), true
}

type runState struct {
	w            Workload
	o            Options
	measureStart time.Time
	measureEnd   time.Time // zero when bounded by count only
	stop         chan struct{}
	stopOnce     sync.Once

	issued    atomic.Int64 // measured messages handed to producers
	published atomic.Int64
	completed atomic.Int64
	failed    atomic.Int64
	// pubErr is the first error a publish completed with, for the notes.
	pubErr   atomic.Pointer[string]
	consumed atomic.Int64
	// all* count warm-up traffic too, for the progress line.
	completedAll atomic.Int64
	consumedAll  atomic.Int64
	malformed    atomic.Int64
	lastComplete atomic.Int64 // Unix ns
	lastConsume  atomic.Int64

	pubRecs []*recorder
	conRecs []*recorder

	firstErr struct {
		sync.Mutex
		err error
	}
}

func (s *runState) fail(err error) {
	s.firstErr.Lock()
	if s.firstErr.err == nil {
		s.firstErr.err = err
	}
	s.firstErr.Unlock()
	s.halt()
}

func (s *runState) halt() { s.stopOnce.Do(func() { close(s.stop) }) }

func (s *runState) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// Run carries out w through o.Driver and returns what it measured. It
// returns an error if setup fails or a producer or consumer cannot start
// or breaks off, or if the queues it created could not be deleted; publish
// failures reported by the broker are counted, not returned.
//
// Run declares the queues it needs that do not exist, refuses queues that
// exist and hold messages unless o.Reuse, and deletes the queues it
// created (only those) when it ends, unless o.Keep.
func Run(ctx context.Context, w Workload, o Options) (res *Result, err error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if w.Consumers > 0 && w.Consumers < w.Queues {
		return nil, fmt.Errorf("bench: %d consumers cannot drain %d queues", w.Consumers, w.Queues)
	}
	if o.Driver == nil {
		return nil, errors.New("bench: no driver")
	}
	if o.Interval <= 0 {
		o.Interval = progressIntervalDefault
	}
	if o.DrainIdle <= 0 {
		o.DrainIdle = drainIdleDefault
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = drainTimeoutDefault
	}
	queues := w.QueueNames()
	perQueue := 0
	if w.Consumers > 0 {
		perQueue = (w.Consumers + w.Queues - 1) / w.Queues
	}
	cc := driver.ConsumerConfig{Credit: w.Credit, Ack: w.Ack, PerQueue: perQueue}
	// Registered first, so it runs after every connection is closed.
	defer func() {
		created := o.Driver.Created()
		if len(created) == 0 {
			return
		}
		if o.Keep {
			if res != nil {
				res.Notes = append(res.Notes, fmt.Sprintf("kept the queues it created (--keep): %s", strings.Join(created, ", ")))
			}
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if cerr := o.Driver.Cleanup(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("bench: deleting the queues it created: %w", cerr))
			return
		}
		if res != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("deleted the queues it created: %s", strings.Join(created, ", ")))
		}
	}()
	if err := o.Driver.Setup(ctx, queues, cc, driver.SetupOptions{Reuse: o.Reuse}); err != nil {
		return nil, err
	}

	s := &runState{w: w, o: o, stop: make(chan struct{})}
	var consumers []driver.Consumer
	defer func() {
		for _, c := range consumers {
			_ = c.Close()
		}
	}()
	for i := 0; i < w.Consumers; i++ {
		rec := newRecorder()
		s.conRecs = append(s.conRecs, rec)
		c, err := o.Driver.NewConsumer(ctx, i, queues[i%len(queues)], cc, s.handler(rec))
		if err != nil {
			return nil, err
		}
		consumers = append(consumers, c)
	}
	producers := make([]driver.Producer, 0, w.Producers)
	defer func() {
		for _, p := range producers {
			_ = p.Close()
		}
	}()
	for i := 0; i < w.Producers; i++ {
		p, err := o.Driver.NewProducer(ctx, i)
		if err != nil {
			return nil, err
		}
		producers = append(producers, p)
		s.pubRecs = append(s.pubRecs, newRecorder())
	}

	started := time.Now()
	s.measureStart = started.Add(w.Warmup)
	if w.Duration > 0 {
		s.measureEnd = s.measureStart.Add(w.Duration)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-runCtx.Done():
			s.halt()
		case <-s.stop:
		}
	}()

	var wg sync.WaitGroup
	for i, p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.produce(runCtx, i, p, queues)
		}()
	}
	producersDone := make(chan struct{})
	go func() { wg.Wait(); close(producersDone) }()

	res = &Result{
		Version: ResultVersion, Driver: o.DriverName, Addrs: o.Addrs, Label: o.Label,
		Workload: w.String(), Settings: settingsOf(&w), Started: started,
	}
	profiling := false
	s.progress(producersDone, res, func() {
		if o.Profiler != nil && !profiling {
			profiling = true
			secs := int(w.Duration.Round(time.Second) / time.Second)
			if secs == 0 {
				secs = o.Profiler.Seconds
			}
			o.Profiler.Start(runCtx, max(1, secs))
		}
	})
	s.drain(res)
	if o.Profiler != nil {
		if !profiling {
			o.Profiler.Start(runCtx, 1)
		}
		res.Notes = append(res.Notes, o.Profiler.Finish(ctx)...)
	}
	s.finish(res)
	s.firstErr.Lock()
	runErr := s.firstErr.err
	s.firstErr.Unlock()
	if runErr != nil && ctx.Err() == nil {
		return res, runErr
	}
	return res, ctx.Err()
}

func (s *runState) handler(rec *recorder) func([]byte) {
	return func(p []byte) {
		sent, ok := SendTime(p)
		if !ok {
			s.malformed.Add(1)
			return
		}
		now := time.Now()
		s.consumedAll.Add(1)
		measured := !sent.Before(s.measureStart)
		rec.record(now.Sub(sent), measured)
		if measured {
			s.consumed.Add(1)
			s.lastConsume.Store(now.UnixNano())
		}
	}
}

// produce is one producer's loop: it stops at the duration, at the count,
// or when the run halts, then waits for its own completions.
func (s *runState) produce(ctx context.Context, id int, p driver.Producer, queues []string) {
	w := &s.w
	inflight := w.InFlight()
	sem := make(chan struct{}, inflight)
	var batch sync.WaitGroup
	inBatch := 0
	payload := make([]byte, w.Size)
	rec := s.pubRecs[id]
	var gap time.Duration
	next := time.Now()
	if w.Rate > 0 {
		gap = time.Duration(float64(time.Second) * float64(w.Producers) / w.Rate)
	}
	for seq := uint64(0); ; seq++ {
		var sent time.Time
		if gap > 0 {
			// Open loop: the message's time is when it was due, so time
			// spent waiting for window room counts as latency.
			next = next.Add(gap)
			if d := time.Until(next); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-s.stop:
					t.Stop()
				}
			}
			sent = next
		}
		if s.stopped() {
			break
		}
		if gap == 0 {
			sent = time.Now()
		}
		if !s.measureEnd.IsZero() && !sent.Before(s.measureEnd) {
			break
		}
		measured := !sent.Before(s.measureStart)
		if measured && w.Count > 0 && s.issued.Add(1) > w.Count {
			break
		}
		acquired := false
		select {
		case sem <- struct{}{}:
			acquired = true
		case <-s.stop:
		}
		if s.stopped() {
			if acquired {
				<-sem // the final wait below must find every slot free
			}
			break
		}
		binary.LittleEndian.PutUint64(payload[payloadTimeOff:], uint64(sent.UnixNano()))
		binary.LittleEndian.PutUint64(payload[payloadSeqOff:], uint64(id)<<40|seq)
		if w.Mode == ModeBatch {
			batch.Add(1)
		}
		err := p.Publish(ctx, queues[(id+int(seq))%len(queues)], payload, func(err error) {
			now := time.Now()
			if err != nil {
				if s.pubErr.Load() == nil {
					msg := err.Error()
					s.pubErr.CompareAndSwap(nil, &msg)
				}
				if measured {
					s.failed.Add(1)
				}
			} else {
				s.completedAll.Add(1)
				rec.record(now.Sub(sent), measured)
				if measured {
					s.completed.Add(1)
				}
			}
			if measured {
				s.lastComplete.Store(now.UnixNano())
			}
			<-sem
			if w.Mode == ModeBatch {
				batch.Done()
			}
		})
		if err != nil {
			<-sem
			if w.Mode == ModeBatch {
				batch.Done()
			}
			if ctx.Err() == nil {
				s.fail(fmt.Errorf("bench: producer %d: %w", id, err))
			}
			break
		}
		if measured {
			s.published.Add(1)
		}
		if w.Mode == ModeBatch {
			if inBatch++; inBatch == w.Batch {
				batch.Wait()
				inBatch = 0
			}
		}
	}
	// Wait for this producer's completions, bounded.
	deadline := time.NewTimer(s.o.DrainTimeout)
	defer deadline.Stop()
	for range inflight {
		select {
		case sem <- struct{}{}:
		case <-deadline.C:
			s.fail(fmt.Errorf("bench: producer %d: completions still missing after %v", id, s.o.DrainTimeout))
			return
		}
	}
}

// progress prints a line per interval and records the timeline until the
// producers are done. onMeasure runs once the measured phase has begun.
func (s *runState) progress(producersDone <-chan struct{}, res *Result, onMeasure func()) {
	tick := time.NewTicker(s.o.Interval)
	defer tick.Stop()
	pubH, e2eH := newHistogram(), newHistogram()
	lastT := time.Now()
	var lastPub, lastCon int64
	if !time.Now().Before(s.measureStart) {
		onMeasure()
	}
	var measureTimer <-chan time.Time
	if d := time.Until(s.measureStart); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		measureTimer = t.C
	}
	for {
		select {
		case <-producersDone:
			s.sample(pubH, e2eH, &lastT, &lastPub, &lastCon, res)
			if s.o.Progress != nil && s.o.ProgressCR {
				fmt.Fprintln(s.o.Progress)
			}
			return
		case <-measureTimer:
			onMeasure()
		case <-tick.C:
			s.sample(pubH, e2eH, &lastT, &lastPub, &lastCon, res)
		}
	}
}

func (s *runState) sample(pubH, e2eH *hdrhistogram.Histogram, lastT *time.Time, lastPub, lastCon *int64, res *Result) {
	now := time.Now()
	pubH.Reset()
	e2eH.Reset()
	for _, r := range s.pubRecs {
		r.takeInterval(pubH)
	}
	for _, r := range s.conRecs {
		r.takeInterval(e2eH)
	}
	secs := now.Sub(*lastT).Seconds()
	// A sliver of an interval at the end would plot as a spike of noise.
	if secs < s.o.Interval.Seconds()/4 {
		return
	}
	pub, con := s.completedAll.Load(), s.consumedAll.Load()
	// An interval that began in the warm-up is shown but not kept.
	inMeasure := !lastT.Before(s.measureStart.Add(-10 * time.Millisecond))
	smp := Sample{
		T:           now.Sub(s.measureStart).Seconds(),
		PublishRate: float64(pub-*lastPub) / secs,
		ConsumeRate: float64(con-*lastCon) / secs,
		PublishP50:  pubH.ValueAtQuantile(50),
		PublishP99:  pubH.ValueAtQuantile(99),
		E2EP50:      e2eH.ValueAtQuantile(50),
		E2EP99:      e2eH.ValueAtQuantile(99),
	}
	*lastT, *lastPub, *lastCon = now, pub, con
	phase := "measure"
	if !inMeasure {
		phase = "warmup"
	} else if len(res.Timeline) < timelineMax {
		res.Timeline = append(res.Timeline, smp)
	}
	if s.o.Progress == nil {
		return
	}
	end := "\n"
	start := ""
	if s.o.ProgressCR {
		start, end = "\r\033[K", ""
	}
	fmt.Fprintf(s.o.Progress, "%s[%6.1fs %-7s] pub %8.0f/s  cons %8.0f/s  pub p50 %-8s p99 %-8s  e2e p50 %-8s p99 %-8s%s",
		start, smp.T, phase, smp.PublishRate, smp.ConsumeRate,
		FormatLatency(smp.PublishP50), FormatLatency(smp.PublishP99), FormatLatency(smp.E2EP50), FormatLatency(smp.E2EP99), end)
}

// drain waits, bounded, for consumers to receive what was completed.
func (s *runState) drain(res *Result) {
	if s.w.Consumers == 0 {
		return
	}
	deadline := time.Now().Add(s.o.DrainTimeout)
	last, lastChange := s.consumed.Load(), time.Now()
	for s.consumed.Load() < s.completed.Load() && time.Now().Before(deadline) {
		if s.stopped() {
			return
		}
		time.Sleep(10 * time.Millisecond)
		if n := s.consumed.Load(); n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) > s.o.DrainIdle {
			res.Notes = append(res.Notes, fmt.Sprintf("deliveries stopped for %v before all completed messages arrived", s.o.DrainIdle))
			return
		}
	}
}

func (s *runState) finish(res *Result) {
	res.Published = s.published.Load()
	res.Completed = s.completed.Load()
	res.Failed = s.failed.Load()
	if e := s.pubErr.Load(); e != nil {
		res.Notes = append(res.Notes, "first failed publish: "+*e)
	}
	res.Consumed = s.consumed.Load()
	if s.w.Consumers > 0 && res.Completed > res.Consumed {
		res.Lost = res.Completed - res.Consumed
	}
	if n := s.malformed.Load(); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d deliveries too short to carry a send time", n))
	}
	start := s.measureStart.UnixNano()
	pubSpan := float64(s.lastComplete.Load()-start) / 1e9
	conSpan := float64(s.lastConsume.Load()-start) / 1e9
	if pubSpan > 0 {
		res.PublishRate = float64(res.Completed) / pubSpan
		res.PublishMBps = res.PublishRate * float64(s.w.Size) / 1e6
	}
	if conSpan > 0 {
		res.ConsumeRate = float64(res.Consumed) / conSpan
	}
	res.ElapsedSec = max(pubSpan, conSpan, 0)
	pubH, e2eH := newHistogram(), newHistogram()
	for _, r := range s.pubRecs {
		r.mergeTotal(pubH)
	}
	for _, r := range s.conRecs {
		r.mergeTotal(e2eH)
	}
	res.Publish = Summarize(pubH)
	res.EndToEnd = Summarize(e2eH)
}
