package server_test

import (
	"testing"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/wire"
)

// A PUBLISH with the producer flag in a session below 1.2, or with
// producer id 0, is malformed: ERROR then CLOSE for that connection only.
func TestBadProducerPublishIsMalformed(t *testing.T) {
	s := startServer(t)
	ctx := ctxT(t)
	good := dial(t, s)
	if err := good.DeclareQueue(ctx, "pq", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	producerPublish := func(v wire.Version, producer uint64) []byte {
		b, st := wire.AppendPublishStartProducer(nil, v, 1, producer, "", 1)
		b = wire.AppendPublishMessage(b, 0, 0, "pq", nil, []byte("x"))
		wire.EndFrame(b, st, 0)
		return b
	}
	cases := map[string][]byte{
		"producer in 1.1": append(wire.AppendHello(nil, []wire.Version{wire.VersionAuth}, "x", "none", nil, 0, 0), producerPublish(wire.VersionAuth, 7)...),
		"producer 0":      append(wire.AppendHello(nil, []wire.Version{wire.VersionProducer}, "x", "none", nil, 0, 0), producerPublish(wire.VersionProducer, 0)...),
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			nc := rawConn(t, s)
			if _, err := nc.Write(input); err != nil {
				t.Fatal(err)
			}
			types, errs := readFrames(t, nc)
			if len(errs) == 0 || types[len(types)-1] != wire.TypeClose || errs[0].Code != wire.CodeMalformed {
				t.Fatalf("got frames %v errors %+v, want ERROR(malformed) then CLOSE", types, errs)
			}
		})
	}
	if err := good.Publish(ctx, "", "pq", []byte("still here"), client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
}
