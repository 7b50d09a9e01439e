package shards

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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

type WiringExchange struct {
	Name    string          `json:"name"`
	Kind    uint8           `json:"kind"`
	Options ExchangeOptions `json:"options"`
}

type WiringQueue struct {
	Name    string       `json:"name"`
	Options QueueOptions `json:"options"`
}

func loadWiring(dir string) (*wiringState, error) {
	data, err := os.ReadFile(filepath.Join(dir, wiringFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("shards: read wiring: %w", err)
	}
	var st wiringState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("shards: wiring file %s is corrupt: %w", filepath.Join(dir, wiringFile), err)
	}
	return &st, nil
}

// saveWiringLocked writes the durable part of r. b.mu must be held. With
// a wiring log, the log holds the wiring and the file only the shard count.
func (b *Broker) saveWiringLocked(r *Routing) error {
	if b.cfg.Journal == nil {
		return nil
	}
	st := wiringState{Version: 1, Shards: len(b.shards)}
	if b.cfg.WiringLog != nil {
		r = emptyRouting()
	}
	durableQ := map[string]bool{}
	durableX := map[string]bool{}
	for name, ex := range r.exchanges {
		if ex.options.Durable {
			durableX[name] = true
			st.Exchanges = append(st.Exchanges, WiringExchange{Name: name, Kind: ex.kind, Options: ex.options})
		}
	}
	for name, q := range r.queues {
		if q.Options.Durable && !q.Options.Exclusive {
			durableQ[name] = true
			st.Queues = append(st.Queues, WiringQueue{Name: name, Options: q.Options})
		}
	}
	for _, bd := range r.bindings {
		if durableX[bd.Exchange] && durableQ[bd.Queue] {
			st.Bindings = append(st.Bindings, bd)
		}
	}
	data, err := json.MarshalIndent(&st, "", " ")
	if err != nil {
		return err
	}
	dir := b.cfg.Journal.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	tmp := filepath.Join(dir, wiringFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := f.Close(); err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, wiringFile)); err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return Errorf(wire.CodeStore, "save wiring: %v", err)
	}
	return nil
}
