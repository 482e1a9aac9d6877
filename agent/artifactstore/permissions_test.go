package artifactstore

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

const readerNode = "n1"

// readerConsumer is the one consumer the reader login of these tests may
// pull; each read the admin makes for it replaces the last.
var readerConsumer = bus.ArtifactConsumer(readerNode, "t1")

// grantedReads is the source a node's fetch under auth is: the admin (the
// control plane) creates the read for each Open, the reader pulls it.
type grantedReads struct {
	admin, reader  jetstream.JetStream
	object, digest string
}

func (g grantedReads) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	_ = g.admin.DeleteConsumer(ctx, bus.ObjectStream(bus.ObjectBucketArtifacts), readerConsumer)
	r, err := bus.CreateObjectRead(ctx, g.admin, bus.ObjectBucketArtifacts, g.object, offset, bus.ObjectReadConfig{Name: readerConsumer, Inactive: time.Minute})
	if err != nil {
		return nil, err
	}
	return NewObjectSource(g.reader, bus.ObjectBucketArtifacts, schemas.ArtifactObjectRead(r), g.digest).Open(ctx, offset)
}

// TestObjectSourceNeedsOnlyReaderPermissions fetches and resumes over a
// login with exactly an artifact login's permissions
// (bus.PermsArtifactReader): nothing is refused.
func TestObjectSourceNeedsOnlyReaderPermissions(t *testing.T) {
	srv, obs, admin := permServer(t, readerUser(bus.PermsArtifactReader(readerNode, readerConsumer)))
	b, digest := content(t, 40<<20+1)
	putObject(t, obs, "m", b)
	rjs, violations := dialReader(t, srv)

	s := newStore(t, WithRetry(0, 0))
	ctx, cancel := context.WithCancel(ctxT(t))
	src := grantedReads{admin: admin, reader: rjs, object: "m", digest: digest}
	first := &countingSource{Source: src, cancelAt: 20 << 20, cancel: cancel}
	_, _ = s.Ensure(ctx, Want{Digest: digest, SizeBytes: int64(len(b)), Source: first})
	second := &countingSource{Source: src}
	res, err := s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: second})
	if err != nil {
		t.Fatalf("fetch over the reader login: %v", err)
	}
	fileEquals(t, res.Path, b)
	if len(second.offsets) != 1 || second.offsets[0] == 0 {
		t.Fatalf("second fetch opened at %v, want a resume", second.offsets)
	}
	if v := violations(); len(v) != 0 {
		t.Fatalf("permission violations: %v", v)
	}
}

// TestArtifactReaderConfined: the artifact login creates no consumer
// (ephemeral, durable or push, filtered to its own object or not), reads no
// object's meta record or chunks by direct or message get, pulls no
// consumer but its own, and deletes none.
func TestArtifactReaderConfined(t *testing.T) {
	srv, obs, admin := permServer(t, readerUser(bus.PermsArtifactReader(readerNode, readerConsumer)))
	mine, _ := content(t, 300<<10)
	theirs, _ := content(t, 300<<10)
	putObject(t, obs, "mine", mine)
	putObject(t, obs, "theirs", theirs)
	ctx := ctxT(t)
	stream := bus.ObjectStream(bus.ObjectBucketArtifacts)
	if _, err := bus.CreateObjectRead(ctx, admin, bus.ObjectBucketArtifacts, "mine", 0, bus.ObjectReadConfig{Name: readerConsumer, Inactive: time.Minute}); err != nil {
		t.Fatal(err)
	}
	other := bus.ArtifactConsumer("n2", "t2")
	if _, err := bus.CreateObjectRead(ctx, admin, bus.ObjectBucketArtifacts, "theirs", 0, bus.ObjectReadConfig{Name: other, Inactive: time.Minute}); err != nil {
		t.Fatal(err)
	}
	info, err := obs.GetInfo(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	rjs, violations := dialReader(t, srv)
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }
	mineChunks := bus.ObjectChunks(bus.ObjectBucketArtifacts, info.NUID)
	for _, c := range []struct {
		name string
		cfg  jetstream.ConsumerConfig
		push bool
	}{
		{"ephemeral pull", jetstream.ConsumerConfig{FilterSubject: mineChunks}, false},
		{"named pull", jetstream.ConsumerConfig{Name: "artifact_n1_x", FilterSubject: mineChunks}, false},
		{"durable", jetstream.ConsumerConfig{Durable: "artifact_n1_d", FilterSubject: mineChunks}, false},
		{"push", jetstream.ConsumerConfig{Name: "artifact_n1_p", DeliverSubject: "wf.node.n2.cmd", FilterSubject: mineChunks}, true},
		{"ordered", jetstream.ConsumerConfig{}, false},
	} {
		cctx, cancel := short()
		var err error
		switch {
		case c.name == "ordered":
			_, err = rjs.OrderedConsumer(cctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{mineChunks}})
		case c.push:
			_, err = rjs.CreatePushConsumer(cctx, stream, c.cfg)
		default:
			_, err = rjs.CreateConsumer(cctx, stream, c.cfg)
		}
		cancel()
		if err == nil {
			t.Errorf("the reader created a consumer (%s)", c.name)
		}
	}
	str, err := admin.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for names := str.ConsumerNames(ctx); ; {
		n, ok := <-names.Name()
		if !ok {
			break
		}
		if n != readerConsumer && n != other {
			t.Errorf("consumer %s exists after the reader's attempts", n)
		}
	}
	nc := rjs.Conn()
	for _, subj := range []string{
		"$JS.API.DIRECT.GET." + stream + "." + bus.ObjectMeta(bus.ObjectBucketArtifacts, "theirs"),
		"$JS.API.DIRECT.GET." + stream + "." + bus.ObjectMeta(bus.ObjectBucketArtifacts, "mine"),
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + other,
		"$JS.API.CONSUMER.INFO." + stream + "." + other,
		"$JS.API.CONSUMER.DELETE." + stream + "." + readerConsumer,
		"$JS.API.CONSUMER.CREATE." + stream + ".artifact_n1_y." + mineChunks,
	} {
		if _, err := nc.Request(subj, []byte(`{"last_by_subj":"`+bus.ObjectMeta(bus.ObjectBucketArtifacts, "theirs")+`","batch":1}`), 500*time.Millisecond); err == nil {
			t.Errorf("the reader was answered on %s", subj)
		}
	}
	// Its own consumer serves its own object, and only that.
	cctx, cancel := short()
	defer cancel()
	cons, err := rjs.Consumer(cctx, stream, readerConsumer)
	if err != nil {
		t.Fatalf("the reader's own consumer: %v", err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for m := range batch.Messages() {
		if m.Subject() != mineChunks {
			t.Fatalf("the reader's consumer delivered %s", m.Subject())
		}
		got = append(got, m.Data()...)
	}
	if string(got) != string(mine) {
		t.Fatalf("the reader read %d bytes of its object's %d", len(got), len(mine))
	}
	if ci, err := admin.Consumer(ctx, stream, readerConsumer); err != nil {
		t.Fatalf("the reader's consumer is gone: %v", err)
	} else if ci.CachedInfo().Config.DeliverSubject != "" {
		t.Fatal("the reader's consumer became a push consumer")
	}
	if !slicesHasViolation(violations(), "CONSUMER.CREATE") || !slicesHasViolation(violations(), "DIRECT.GET") {
		t.Fatalf("violations %v, want the creates and gets refused by the server", violations())
	}
}

func slicesHasViolation(errs []error, what string) bool {
	for _, e := range errs {
		if errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), what) {
			return true
		}
	}
	return false
}

// TestObjectSourceRefusedLogin: a login that may not pull the consumer is
// ErrSourceAuth, not a retried timeout.
func TestObjectSourceRefusedLogin(t *testing.T) {
	srv, obs, admin := permServer(t, readerUser(bus.PermsArtifactReader(readerNode, bus.ArtifactConsumer(readerNode, "other"))))
	b, digest := content(t, 1<<20)
	putObject(t, obs, "m", b)
	rc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("reader", "r"), nats.CustomInboxPrefix(bus.ArtifactInboxPrefix(readerNode)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rjs, _ := jetstream.New(rc, jetstream.WithDefaultTimeout(2*time.Second))
	s := newStore(t)
	_, err = s.Ensure(ctxT(t), Want{Digest: digest, SizeBytes: int64(len(b)), Source: grantedReads{admin: admin, reader: rjs, object: "m", digest: digest}})
	if !errors.Is(err, ErrSourceAuth) {
		t.Fatalf("err %v, want ErrSourceAuth", err)
	}
}

func readerUser(p bus.Permissions) *server.User {
	return &server.User{Username: "reader", Password: "r", Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe},
	}}
}

// dialReader connects as the reader with an artifact login's inbox; the
// returned func lists the asynchronous errors (permission violations) so
// far.
func dialReader(t *testing.T, srv *server.Server) (jetstream.JetStream, func() []error) {
	t.Helper()
	var mu sync.Mutex
	var errs []error
	rc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("reader", "r"), nats.CustomInboxPrefix(bus.ArtifactInboxPrefix(readerNode)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	rjs, err := jetstream.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return rjs, func() []error {
		_ = rc.Flush()
		mu.Lock()
		defer mu.Unlock()
		return append([]error(nil), errs...)
	}
}

// permServer starts a nats-server with an admin login and reader, and the
// artifact bucket made by the admin.
func permServer(t *testing.T, reader *server.User) (*server.Server, jetstream.ObjectStore, jetstream.JetStream) {
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
	return srv, obs, ajs
}
