package requests_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane/requests"
	"github.com/warmfleet/warmfleet/internal/keyed"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/schemas"
)

type ask struct {
	Name string `json:"name"`
	Fail string `json:"fail,omitempty"` // "refuse" or "break"
}

func (a *ask) Validate() error {
	if a.Name == "" {
		return &schemas.Refusal{Code: schemas.CodeMissingField, Field: "name", Reason: "a name is required"}
	}
	return nil
}

type greeting struct {
	Text    string `json:"text"`
	Subject string `json:"subject"`
}

func greet(_ context.Context, subject string, a ask) (greeting, error) {
	switch a.Fail {
	case "refuse":
		return greeting{}, &schemas.Refusal{Code: schemas.CodeWrongNode, Field: "name", Reason: "not yours"}
	case "break":
		return greeting{}, errors.New("the store is down")
	}
	return greeting{Text: "hello " + a.Name, Subject: subject}, nil
}

// serve runs servers on a fresh NATS until the test ends and returns a
// client connection.
func serve(t *testing.T, servers ...requests.Endpoint) *nats.Conn {
	t.Helper()
	conn := testenv.Dial(t, testenv.StartNATS(t).URL(), "requests-test")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop, err := requests.Serve(ctx, &wg, conn.NC, servers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(); cancel(); wg.Wait() })
	return conn.NC
}

// request sends body in enc (nil: raw bytes as given) and decodes the
// reply in the encoding its header names.
func request(t *testing.T, nc *nats.Conn, subject string, enc codec.Encoding, body any, out any) codec.Encoding {
	t.Helper()
	m := &nats.Msg{Subject: subject, Header: nats.Header{}}
	if b, ok := body.([]byte); ok {
		m.Data = b
	} else {
		b, err := codec.Encode(enc, body)
		if err != nil {
			t.Fatal(err)
		}
		m.Data = b
		m.Header.Set(codec.ContentTypeHeader, enc.ContentType())
	}
	resp, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	got := codec.Detect(resp.Header, resp.Data)
	if err := codec.Decode(got, resp.Data, out); err != nil {
		t.Fatalf("reply to %s: %v", subject, err)
	}
	return got
}

// A coded server decodes either encoding and answers in it; what does not
// decode or validate is refused with its code without reaching the answer;
// the answer's errors are its coded refusals.
func TestCoded(t *testing.T) {
	srv := requests.Coded("t.greet.*", "body is not an ask", (*ask).Validate, greet, zaptest.NewLogger(t))
	var refused atomic.Int64
	srv.Refused = &refused
	nc := serve(t, srv)

	for _, enc := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		var rep schemas.Reply[greeting]
		if got := request(t, nc, "t.greet.a", enc, ask{Name: "ada"}, &rep); got != enc {
			t.Errorf("a %s request answered in %s", enc, got)
		}
		if rep.Refusal != nil || rep.OK == nil || rep.OK.Text != "hello ada" || rep.OK.Subject != "t.greet.a" {
			t.Errorf("%s: %+v %+v, want the answer, told its subject", enc, rep.OK, rep.Refusal)
		}
	}
	for _, c := range []struct {
		name   string
		body   any
		code   schemas.Code
		field  string
		reason string
	}{
		{"garbage", []byte("\xc1\xc1"), schemas.CodeMalformed, "", "body is not an ask"},
		{"an empty body", []byte{}, schemas.CodeMalformed, "", "body is not an ask"},
		{"an unknown field", []byte(`{"name":"ada","colour":"red"}`), schemas.CodeUnknownField, "", "body is not an ask: it has a field this control plane does not know"},
		{"an invalid request", ask{}, schemas.CodeMissingField, "name", "a name is required"},
		{"an answer's refusal", ask{Name: "ada", Fail: "refuse"}, schemas.CodeWrongNode, "name", "not yours"},
		{"an answer's failure", ask{Name: "ada", Fail: "break"}, schemas.CodeInternal, "", "the store is down"},
	} {
		var rep schemas.Reply[greeting]
		request(t, nc, "t.greet.a", codec.JSON, c.body, &rep)
		if r := rep.Refusal; rep.OK != nil || r == nil || r.Code != c.code || r.Field != c.field || r.Reason != c.reason {
			t.Errorf("%s: %+v %+v, want %s on %q: %q", c.name, rep.OK, rep.Refusal, c.code, c.field, c.reason)
		}
	}
	if n := refused.Load(); n != 4 {
		t.Errorf("Refused = %d, want the 4 inputs refused before the answer", n)
	}
}

// A server may answer every request in JSON and take an empty body as the
// zero request; its Refuse shapes a refusal as its replies carry one.
func TestServer_JSONEmptyAndOwnRefusal(t *testing.T) {
	type reply struct {
		Name  string `json:"name,omitempty"`
		Error string `json:"error,omitempty"`
	}
	nc := serve(t, &requests.Server[ask, reply]{
		Subject: "t.own", Malformed: "body is not an ask", JSON: true, Empty: true, Log: zaptest.NewLogger(t),
		Validate: (*ask).Validate,
		Answer:   func(_ context.Context, _ string, a ask) reply { return reply{Name: "<" + a.Name + ">"} },
		Refuse: func(r *schemas.Refusal, err error) reply {
			if !errors.Is(err, codec.ErrMalformed) && r.Code != schemas.CodeMissingField {
				return reply{Error: "unexpected"}
			}
			return reply{Error: string(r.Code)}
		},
	})
	var rep reply
	if got := request(t, nc, "t.own", codec.MsgPack, ask{Name: "ada"}, &rep); got != codec.JSON || rep.Name != "<ada>" {
		t.Errorf("a msgpack request: %+v in %s, want the answer in JSON", rep, got)
	}
	rep = reply{}
	if got := request(t, nc, "t.own", codec.JSON, []byte{}, &rep); got != codec.JSON || rep.Name != "<>" {
		t.Errorf("an empty body: %+v in %s, want the zero request's answer, unvalidated, in JSON", rep, got)
	}
	for body, want := range map[string]string{"{": string(schemas.CodeMalformed), `{"name":""}`: string(schemas.CodeMissingField)} {
		rep = reply{}
		if request(t, nc, "t.own", codec.JSON, []byte(body), &rep); rep.Error != want {
			t.Errorf("%q: %+v, want Refuse's %s", body, rep, want)
		}
	}
}

// A slow answer holds up no other request of its subject, up to the pool's
// workers; stop unsubscribes.
func TestServe_PoolAndStop(t *testing.T) {
	release := make(chan struct{})
	srv := requests.Coded("t.slow", "body is not an ask", (*ask).Validate, func(ctx context.Context, s string, a ask) (greeting, error) {
		if a.Name == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return greet(ctx, s, a)
	}, zaptest.NewLogger(t))
	srv.Pool = keyed.PoolOptions{Workers: 2}
	conn := testenv.Dial(t, testenv.StartNATS(t).URL(), "requests-test")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	stop, err := requests.Serve(ctx, &wg, conn.NC, srv)
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		b, _ := codec.Encode(codec.JSON, ask{Name: "slow"})
		_, err := conn.NC.Request("t.slow", b, 10*time.Second)
		slow <- err
	}()
	var rep schemas.Reply[greeting]
	request(t, conn.NC, "t.slow", codec.JSON, ask{Name: "quick"}, &rep)
	if rep.OK == nil || rep.OK.Text != "hello quick" {
		t.Fatalf("a request beside a slow one: %+v %+v", rep.OK, rep.Refusal)
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("the slow request: %v", err)
	}
	stop()
	if _, err := conn.NC.Request("t.slow", []byte(`{"name":"x"}`), time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a request after stop: %v, want no responders", err)
	}
}

func TestReply(t *testing.T) {
	if r := requests.Reply(3, nil); r.OK == nil || *r.OK != 3 || r.Refusal != nil {
		t.Errorf("Reply(3, nil) = %+v", r)
	}
	ref := &schemas.Refusal{Code: schemas.CodeUnknownNode, Field: "id", Reason: "no node"}
	if r := requests.Reply(0, ref); r.OK != nil || r.Refusal != ref {
		t.Errorf("Reply(0, refusal) = %+v, want the refusal itself", r)
	}
	if r := requests.Reply(0, errors.New("boom")); r.OK != nil || r.Refusal == nil || r.Refusal.Code != schemas.CodeInternal || r.Refusal.Reason != "boom" {
		t.Errorf("Reply(0, err) = %+v, want an internal refusal", r)
	}
}

// A body past schemas.MaxNodeMessageBytes is refused payload_too_large
// before it is decoded, whatever the server's max_payload allows.
func TestServer_RefusesOversizedBody(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	answered := 0
	srv := requests.Coded("t.greet.*", "body is not an ask", (*ask).Validate, func(ctx context.Context, s string, a ask) (greeting, error) {
		answered++
		return greet(ctx, s, a)
	}, zap.New(core))
	var refused atomic.Int64
	srv.Refused = &refused
	big := []byte(`{"name":"` + strings.Repeat("a", schemas.MaxNodeMessageBytes) + `"}`)
	srv.Handle(context.Background(), &nats.Msg{Subject: "t.greet.a", Data: big})
	if answered != 0 || refused.Load() != 1 {
		t.Fatalf("answered %d, refused %d: want the oversized body refused", answered, refused.Load())
	}
	if e := logs.FilterField(zap.String("code", string(schemas.CodePayloadTooLarge))); e.Len() != 1 {
		t.Errorf("refusals logged with payload_too_large: %d, want 1", e.Len())
	}
	srv.Handle(context.Background(), &nats.Msg{Subject: "t.greet.a", Data: []byte(`{"name":"ada"}`)})
	if answered != 1 {
		t.Errorf("a small body was not answered")
	}
}
