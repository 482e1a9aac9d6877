package main

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

// A spliced body must be the request the producer meant, in either
// encoding: msgpack carries the id's length, so a wrong splice would not
// decode, or would decode to another id.
func TestSubmitTemplateSplicesTheRequestID(t *testing.T) {
	image := "localhost/bench@" + benchDigest("t")
	for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		t.Run(enc.String(), func(t *testing.T) {
			sampleID := benchRID("n0nce", 0, 0)
			sample, err := submitMsg(runRequest(sampleID, image), enc)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := newSubmitTemplate(sample.Data, sampleID)
			if err != nil {
				t.Fatal(err)
			}
			id := benchRID("n0nce", 17, 1234567)
			got, _, err := schemas.DecodeRunRequest(sample.Header, tmpl.body(id))
			if err != nil {
				t.Fatalf("spliced body does not decode: %v", err)
			}
			if want := runRequest(id, image); !reflect.DeepEqual(got, want) {
				t.Fatalf("spliced body decodes to %+v, want %+v", got, want)
			}
		})
	}
}

func TestSubmitTemplateWantsTheIDOnce(t *testing.T) {
	if _, err := newSubmitTemplate([]byte(`{"request_id":"x"}`), "bench-y"); err == nil {
		t.Fatal("a sample without its id made a template")
	}
	if _, err := newSubmitTemplate([]byte(`{"request_id":"ab","labels":{"k":"ab"}}`), "ab"); err == nil {
		t.Fatal("a sample holding its id twice made a template")
	}
}

func TestReadEventsReturnsEachEventWithItsStoreTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := testenv.StartNATS(t)
	conn := testenv.Dial(t, srv.URL(), "bench-test")
	if err := bus.Provision(ctx, conn.JS, bus.Topology{}); err != nil {
		t.Fatal(err)
	}
	from, err := eventsFrom(ctx, conn.JS)
	if err != nil || from != 1 {
		t.Fatalf("eventsFrom on an empty stream = %d, %v; want 1", from, err)
	}
	if evs, err := readEvents(ctx, conn.JS, from); err != nil || len(evs) != 0 {
		t.Fatalf("readEvents on an empty stream = %v, %v", evs, err)
	}
	before := time.Now().Add(-time.Second)
	for _, ev := range []schemas.RunEvent{
		{RunID: "r-a", Seq: 1, Type: schemas.EventAccepted},
		{RunID: "r-b", Seq: 1, Type: schemas.EventAccepted, Code: schemas.CodeNoCapacity, Decision: &schemas.BookingDecision{RunID: "r-b"}},
		{RunID: "r-a", Seq: 2, Type: schemas.EventDecided},
	} {
		b, err := codec.Encode(codec.JSON, ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.JS.PublishMsg(ctx, &nats.Msg{Subject: bus.RunEventsSubject(schemas.DefaultTenant, ev.RunID), Data: b}, jetstream.WithMsgID(fmt.Sprintf("%s:%d", ev.RunID, ev.Seq))); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := readEvents(ctx, conn.JS, from)
	if err != nil {
		t.Fatal(err)
	}
	// r-b was decided at intake: its accepted event carries the decision.
	want := []struct {
		run, typ string
		decided  bool
	}{{"r-a", "accepted", false}, {"r-b", "accepted", true}, {"r-a", "decided", true}}
	if len(evs) != len(want) {
		t.Fatalf("read %d events, want %d", len(evs), len(want))
	}
	for i, w := range want {
		if evs[i].runID != w.run || evs[i].typ != w.typ || evs[i].decided != w.decided || evs[i].at.Before(before) || evs[i].at.After(time.Now()) {
			t.Errorf("event %d = %+v, want run %s type %s decided %v stored just now", i, evs[i], w.run, w.typ, w.decided)
		}
	}
	// Reading from where the stream ends returns nothing new.
	next, err := eventsFrom(ctx, conn.JS)
	if err != nil || next != 4 {
		t.Fatalf("eventsFrom after 3 events = %d, %v; want 4", next, err)
	}
	if evs, err := readEvents(ctx, conn.JS, next); err != nil || len(evs) != 0 {
		t.Fatalf("readEvents past the end = %v, %v", evs, err)
	}
}
