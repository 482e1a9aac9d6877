package artifactstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
)

// TestObjectSourceNeedsOnlyReaderPermissions fetches and resumes over a
// login allowed only the API calls an artifact read login grants, plus
// its inbox and allow_responses (the flow-control replies).
func TestObjectSourceNeedsOnlyReaderPermissions(t *testing.T) {
	reader := readerUser(readerAPI()...)
	srv, obs := permServer(t, reader)
	b, digest := content(t, 40<<20+1)
	putObject(t, obs, "m", b)

	var mu sync.Mutex
	var violations []error
	rc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("reader", "r"), nats.CustomInboxPrefix("_INBOX_reader"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err)
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rjs, _ := jetstream.New(rc)

	s := newStore(t, WithRetry(0, 0))
	ctx, cancel := context.WithCancel(ctxT(t))
	first := &countingSource{Source: NewObjectSource(rjs, bus.ObjectBucketArtifacts, "m", digest), cancelAt: 20 << 20, cancel: cancel}
	_, _ = s.Ensure(ctx, Want{Digest: digest, SizeBytes: int64(len(b)), Source: first})
	second := &countingSource{Source: NewObjectSource(rjs, bus.ObjectBucketArtifacts, "m", digest)}
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: second})
	if err != nil {
		t.Fatalf("fetch over the reader login: %v", err)
	}
	fileEquals(t, res.Path, b)
	if len(second.offsets) != 1 || second.offsets[0] == 0 {
		t.Fatalf("second fetch opened at %v, want a resume", second.offsets)
	}
	_ = rc.Flush()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) != 0 {
		t.Fatalf("permission violations: %v", violations)
	}
}

// readerAPI is what an artifact read login may call.
func readerAPI() []string {
	stream := "OBJ_" + bus.ObjectBucketArtifacts
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.STREAM.MSG.GET." + stream,
	}
}

func readerUser(publish ...string) *server.User {
	return &server.User{Username: "reader", Password: "r", Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: publish},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_reader.>"}},
		Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
	}}
}

// TestObjectSourceRefusedLogin: a login that may not read the bucket is
// ErrSourceAuth, not a retried timeout.
func TestObjectSourceRefusedLogin(t *testing.T) {
	srv, obs := permServer(t, readerUser(readerAPI()[0], readerAPI()[3]))
	b, digest := content(t, 1<<20)
	putObject(t, obs, "m", b)
	rc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("reader", "r"), nats.CustomInboxPrefix("_INBOX_reader"),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rjs, _ := jetstream.New(rc, jetstream.WithDefaultTimeout(2*time.Second))
	s := newStore(t)
	_, err = s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: NewObjectSource(rjs, bus.ObjectBucketArtifacts, "m", digest)})
	if !errors.Is(err, ErrSourceAuth) {
		t.Fatalf("err %v, want ErrSourceAuth", err)
	}
}

// permServer starts a nats-server with an admin login and reader, and the
// artifact bucket made by the admin.
func permServer(t *testing.T, reader *server.User) (*server.Server, jetstream.ObjectStore) {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		MaxPayload: 8 << 20, NoSigs: true,
		Users: []*server.User{{Username: "admin", Password: "a"}, reader}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	admin, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	ajs, _ := jetstream.New(admin)
	obs, err := ajs.CreateObjectStore(ctxT(t), jetstream.ObjectStoreConfig{Bucket: bus.ObjectBucketArtifacts})
	if err != nil {
		t.Fatal(err)
	}
	return srv, obs
}
