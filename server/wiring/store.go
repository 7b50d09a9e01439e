package wiring

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// wiringFile holds the durable exchanges, queues and bindings. Wiring
// changes are rare, so the whole file is rewritten on each change: written
// to a temporary file, fsynced, renamed over the old one, and the directory
// fsynced.
const wiringFile = "wiring.json"

type wiringState struct {
	Version   int              `json:"version"`
	Shards    int              `json:"shards"`
	Exchanges []WiringExchange `json:"exchanges"`
	Queues    []WiringQueue    `json:"queues"`
	Bindings  []Binding        `json:"bindings"`
}

// WiringExchange is a durable exchange as the wiring file and the wiring
// log hold it.
type WiringExchange struct {
	Name    string          `json:"name"`
	Kind    uint8           `json:"kind"`
	Options ExchangeOptions `json:"options"`
}

// WiringQueue is a durable queue as the wiring file and the wiring log
// hold it.
type WiringQueue struct {
	Name    string              `json:"name"`
	Options shards.QueueOptions `json:"options"`
}

// ShardCount returns the shard count recorded in the data directory, or 0
// for a new one. Queues hash onto shards and each shard has its journal,
// so the count is fixed when the directory is created.
func ShardCount(dir string) (int, error) {
	st, err := loadWiring(dir)
	if err != nil || st == nil {
		return 0, err
	}
	return st.Shards, nil
}

func loadWiring(dir string) (*wiringState, error) {
	data, err := os.ReadFile(filepath.Join(dir, wiringFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wiring: read %s: %w", wiringFile, err)
	}
	var st wiringState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("wiring: wiring file %s is corrupt: %w", filepath.Join(dir, wiringFile), err)
	}
	// Files written before the options became wire.QueueOptions held the
	// TTL in nanoseconds.
	var old struct {
		Queues []struct {
			Options struct{ MessageTTLNanos int64 } `json:"options"`
		} `json:"queues"`
	}
	if json.Unmarshal(data, &old) == nil && len(old.Queues) == len(st.Queues) {
		for i, q := range old.Queues {
			if ns := q.Options.MessageTTLNanos; ns > 0 && st.Queues[i].Options.MessageTTLMs == 0 {
				st.Queues[i].Options.MessageTTLMs = uint64(ns / 1e6)
			}
		}
	}
	return &st, nil
}

// saveLocked writes the durable part of r. w.mu must be held. With a
// wiring log, the log holds the wiring and the file only the shard count.
func (w *Wiring) saveLocked(r *Routing) error {
	if w.cfg.Dir == "" {
		return nil
	}
	st := wiringState{Version: 1, Shards: len(w.b.Shards())}
	if w.cfg.Log != nil {
		r = emptyRouting()
	}
	// Without a log the whole file is rewritten on every durable change:
	// O(wiring) per change. A broker with a controller (the default) never
	// gets here with a wiring to write.
	r.exchanges.All(func(name string, ex *exchange) bool {
		if ex.options.Durable {
			st.Exchanges = append(st.Exchanges, WiringExchange{Name: name, Kind: ex.kind, Options: ex.options})
		}
		return true
	})
	r.queues.All(func(name string, q *shards.Queue) bool {
		if q.Options.Durable && !q.Options.Exclusive {
			st.Queues = append(st.Queues, WiringQueue{Name: name, Options: *q.Options})
			for _, bd := range r.liveBindings(name) {
				if r.exchange(bd.exchange).options.Durable {
					st.Bindings = append(st.Bindings, Binding{Exchange: bd.exchange, Queue: name, Key: bd.key})
				}
			}
		}
		return true
	})
	slices.SortFunc(st.Exchanges, func(a, b WiringExchange) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(st.Queues, func(a, b WiringQueue) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(st.Bindings, func(a, b Binding) int {
		return cmp.Or(strings.Compare(a.Exchange, b.Exchange), strings.Compare(a.Queue, b.Queue), strings.Compare(a.Key, b.Key))
	})
	data, err := json.MarshalIndent(&st, "", " ")
	if err != nil {
		return err
	}
	dir := w.cfg.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	tmp := filepath.Join(dir, wiringFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := f.Close(); err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, wiringFile)); err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return shards.Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	return nil
}
