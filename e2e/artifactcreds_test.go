package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/agent/artifactstore"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/controlplane"
	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestAcceptance_ArtifactCredentialScoped: a node's session can read the
// artifact object store only through a one-time login the control plane
// grants for a fetch of an artifact booked on it, which may pull the one
// consumer of that object's chunks the control plane made and nothing
// else (checkArtifactLoginConfined), can never write it, and
// gets a URL source's header by request/reply only. Nothing of the login's
// token or the header's value is at rest.
//
// The Run is written into wf_runs directly, booked on the node and left
// there, so the test can ask on the node's behalf without the agent's own
// fetch racing it; TestAcceptance_ArtifactFetchUnderAuth is the agent's
// fetch of a submitted Run under the same auth.
func TestAcceptance_ArtifactCredentialScoped(t *testing.T) {
	headerSecret := randomSecret(t)
	urls, err := artifactauth.ParseURLSource("# the models host\nhttps://models.example.com/ Authorization: Bearer " + headerSecret + "\n")
	if err != nil {
		t.Fatal(err)
	}
	// A login's NATS user expires with its grant, so the TTL bounds the
	// 12 MiB read below on a loaded machine too.
	const grantTTL = 30 * time.Second
	// The booked Run is never resent to the node, however long the test takes.
	sf := newSecureFleet(t, func(c *controlplane.Config) {
		c.ArtifactSourceAuth, c.ArtifactGrantTTL, c.RedispatchAfter = urls, grantTTL, time.Hour
	})
	sf.plant("artifact source header value", headerSecret)
	tap := sf.tapStreams()
	// A deadline of the test's own: without one, nats.go bounds each object
	// store call, a whole 12 MiB read or write included, by 5 s.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The artifact's bytes in the object store, as the catalog puts them.
	// Large enough for the ordered consumer to ask for flow control.
	content := []byte("model weights " + strings.Repeat("w", 12<<20))
	sum := sha256.Sum256(content)
	objDigest := "sha256:" + hex.EncodeToString(sum[:])
	object := "sha256/" + hex.EncodeToString(sum[:])
	store, err := sf.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(ctx, object, content); err != nil {
		t.Fatal(err)
	}
	urlDigest := "sha256:" + strings.Repeat("1", 64)
	unbooked := "sha256:" + strings.Repeat("2", 64)

	a := sf.startAgent("node-a")
	token := a.agent.Enrollment().FencingToken
	runsKV, err := sf.conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	const runID = "run-artifacts"
	// book (re)writes the Run as just placed on node-a, so the scheduler
	// leaves it alone while the test asks.
	book := func() {
		t.Helper()
		now := time.Now().UTC()
		r := schemas.Run{ID: runID, Request: schemas.RunRequest{RequestID: runID, Image: testImage, Command: []string{"true"}},
			Phase: schemas.PhasePlaced, PhaseSince: now, Attempt: 1, NodeID: "node-a", AttemptID: runID + "-1", FencingToken: token,
			Artifacts: []schemas.ArtifactMount{
				{Name: "weights", Version: "v1", Digest: objDigest, SizeBytes: int64(len(content)), Source: schemas.ArtifactSource{Object: object}, Path: "/models/weights"},
				{Name: "remote", Version: "v1", Digest: urlDigest, SizeBytes: 1, Source: schemas.ArtifactSource{URL: "https://models.example.com/remote/v1.bin"}, Path: "/models/remote"},
			},
			CreatedAt: now, UpdatedAt: now}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := runsKV.Put(ctx, runID, b); err != nil {
			t.Fatal(err)
		}
	}
	book()
	transport := bus.Transport{URL: sf.url, Options: sf.tls}

	// Before any grant: no artifact login gets in, and the node's own
	// session cannot read the bucket.
	if nc, err := bus.DialArtifactLogin(ctx, transport, "node-a", bus.ArtifactUser("node-a"), randomSecret(t)); err == nil {
		nc.Close()
		t.Fatal("an artifact login with no grant was admitted")
	} else if !bus.IsAuthError(err) {
		t.Fatalf("artifact login with no grant: %v, want an authorization violation", err)
	}
	{
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if _, err := a.conn.JS.ObjectStore(rctx, bus.ObjectBucketArtifacts); err == nil {
			t.Fatal("the node's own session opened the artifact object store")
		}
		cancel()
	}

	// Not booked here: refused, coded.
	_, err = a.agent.ArtifactCredential(ctx, unbooked, runID, "")
	var credErr *agent.ArtifactCredentialError
	if !errors.As(err, &credErr) || credErr.Refusal == nil || credErr.Refusal.Code != schemas.CodeArtifactNotWanted {
		t.Fatalf("credential for an artifact not booked on the node: %v, want %s", err, schemas.CodeArtifactNotWanted)
	}
	if credErr.Code() != schemas.CodeArtifactSourceAuthFailed {
		t.Fatalf("a refused credential fails the Run with %s, want %s", credErr.Code(), schemas.CodeArtifactSourceAuthFailed)
	}

	// Booked: a one-time login that reads and cannot write.
	cred, err := a.agent.ArtifactCredential(ctx, objDigest, runID, "")
	if err != nil {
		t.Fatal(err)
	}
	if cred.Login == nil || cred.Login.User != bus.ArtifactUser("node-a") || len(cred.Headers) != 0 {
		t.Fatalf("credential for an object: %v, want a login as %s", cred, bus.ArtifactUser("node-a"))
	}
	sf.plant("artifact login token 1", cred.Login.Token)
	if strings.Contains(cred.String(), cred.Login.Token) || strings.Contains(cred.GoString(), cred.Login.Token) {
		t.Fatal("the credential's String prints its token")
	}
	nc, err := a.agent.DialArtifactLogin(ctx, *cred.Login)
	if err != nil {
		t.Fatalf("dial the artifact login: %v", err)
	}
	defer nc.Close()
	violations := &asyncErrs{}
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations.add(err) })
	ljs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Object == nil {
		t.Fatalf("credential for an object: %v names no consumer", cred)
	}
	// Its own object, through the consumer the control plane made for it.
	rc, err := artifactstore.NewObjectSource(ljs, bus.ObjectBucketArtifacts, *cred.Object, objDigest).Open(ctx, 0)
	if err != nil {
		t.Fatalf("the artifact login cannot read its object: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("the artifact login read %d bytes (%v), want the object's %d", len(got), err, len(content))
	}
	if violations.has("violation") {
		t.Fatal("reading the object needed a right the artifact login lacks")
	}
	checkArtifactLoginConfined(t, ctx, sf.conn.JS, ljs, violations, object)
	{
		// No write: a chunk published under $O is refused.
		if err := nc.Publish("$O."+bus.ObjectBucketArtifacts+".C.not-yours", []byte("not yours")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(bus.NodeObs("node-a"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		violations.denied(t, "publish", "$O."+bus.ObjectBucketArtifacts+".C.not-yours")
		violations.denied(t, "publish", bus.NodeObs("node-a"))
	}
	if _, err := store.GetInfo(ctx, "sha256/"+strings.Repeat("3", 64)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the refused write left an object: %v", err)
	}
	// Used once: the grant is gone and the token cannot log in again.
	grants, err := sf.conn.JS.KeyValue(ctx, bus.BucketArtifactGrants)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grants.Get(ctx, schemas.ArtifactGrantKey(cred.Login.Token)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the used grant is still in %s: %v", bus.BucketArtifactGrants, err)
	}
	if nc2, err := bus.DialArtifactLogin(ctx, transport, "node-a", cred.Login.User, cred.Login.Token); err == nil {
		nc2.Close()
		t.Fatal("an artifact login was admitted a second time")
	} else if !bus.IsAuthError(err) {
		t.Fatalf("second login with one token: %v, want an authorization violation", err)
	}

	// Expired: not admitted.
	book()
	late, err := a.agent.ArtifactCredential(ctx, objDigest, runID, "")
	if err != nil || late.Login == nil {
		t.Fatalf("second credential: %v (%v)", late, err)
	}
	sf.plant("artifact login token 2", late.Login.Token)
	time.Sleep(time.Until(late.Login.Expires) + 500*time.Millisecond)
	if nc3, err := bus.DialArtifactLogin(ctx, transport, "node-a", late.Login.User, late.Login.Token); err == nil {
		nc3.Close()
		t.Fatal("an expired artifact login was admitted")
	} else if !bus.IsAuthError(err) {
		t.Fatalf("expired login: %v, want an authorization violation", err)
	}

	// A fencing token that is not the node's current one is refused.
	book()
	other := token - 1
	if other == 0 {
		other = token + 1
	}
	body, err := codec.Encode(codec.MsgPack, schemas.ArtifactCredentialRequest{NodeID: "node-a", FencingToken: other, Digest: objDigest, RunID: runID})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.conn.NC.Request(bus.NodeArtifactCredentials("node-a"), body, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stale schemas.Reply[schemas.ArtifactCredential]
	if err := codec.Decode(codec.Detect(resp.Header, resp.Data), resp.Data, &stale); err != nil {
		t.Fatal(err)
	}
	if stale.Refusal == nil || stale.Refusal.Code != schemas.CodeStaleFencingToken {
		t.Fatalf("credential asked under another fencing token: %+v, want %s", stale, schemas.CodeStaleFencingToken)
	}

	// A URL source: the header the control plane holds for it, by reply.
	urlCred, err := a.agent.ArtifactCredential(ctx, urlDigest, runID, "")
	if err != nil {
		t.Fatal(err)
	}
	if urlCred.Login != nil || urlCred.Headers["Authorization"] != "Bearer "+headerSecret {
		t.Fatalf("credential for a URL source: %v, want its Authorization header", urlCred)
	}

	for _, h := range sf.searchAtRest(tap) {
		t.Error(h)
	}
}

// TestAcceptance_ArtifactFetchUnderAuth: a submitted Run mounting an
// artifact from the object store, on a fleet with NATS auth: the agent,
// whose own session may not read the bucket, fetches through the one-time
// login it is granted for that fetch, verifies the bytes and the Run
// succeeds, with no permission violation on the server.
func TestAcceptance_ArtifactFetchUnderAuth(t *testing.T) {
	sf := newSecureFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // as above
	defer cancel()
	content := artifactBytes(12<<20, 9)
	digest := sha256Of(content)
	object := "sha256/" + strings.TrimPrefix(digest, "sha256:")
	store, err := sf.conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(ctx, object, content); err != nil {
		t.Fatal(err)
	}
	// The producer's tenant is named as it is (newSecureFleet): the
	// artifact is that tenant's.
	body, _ := json.Marshal(schemas.ArtifactRegistration{Record: schemas.ArtifactRecord{Name: "weights", Version: "v1", Digest: digest,
		SizeBytes: int64(len(content)), Source: schemas.ArtifactSource{Object: object}, Tenant: sf.producerName}})
	resp, err := sf.conn.NC.Request(bus.SubjectArtifactRegister, body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep schemas.Reply[schemas.ArtifactRecord]
	if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.OK == nil {
		t.Fatalf("register: %v %+v", err, rep.Refusal)
	}
	a := sf.startAgent("node-a")
	_, pjs, _ := sf.dial("producer", bus.ProducerCredentials(sf.producerName, sf.producerToken))
	run, _ := json.Marshal(schemas.RunRequest{RequestID: "auth-fetch", Image: testImage, Command: []string{"true"},
		Artifacts: []schemas.ArtifactUse{{Name: "weights", Path: "/models/weights"}}})
	if _, err := pjs.Publish(ctx, sf.producerSubmit(), run, jetstream.WithMsgID("auth-fetch")); err != nil {
		t.Fatal(err)
	}
	sf.waitPhase(sf.producerRun("auth-fetch"), schemas.PhaseSucceeded, time.Minute)
	if got, err := os.ReadFile(replicaPath(a.dataDir, digest)); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("no verified replica on the node (err %v)", err)
	}
	for _, e := range sf.logs.All() {
		if strings.Contains(strings.ToLower(e.Message), "violation") && !strings.Contains(e.Message, "Authorization Violation") {
			t.Errorf("nats-server: %s", e.Message)
		}
	}
}

// checkArtifactLoginConfined: an artifact login (ljs) creates no consumer,
// ephemeral, durable, push or ordered, even of its own object's chunks;
// reads no meta record (its own object's included) or stream message by
// direct or message get; and pulls no consumer but its own: not one the
// control plane made of another object for another node.
func checkArtifactLoginConfined(t *testing.T, ctx context.Context, admin, ljs jetstream.JetStream, violations *asyncErrs, object string) {
	t.Helper()
	stream := bus.ObjectStream(bus.ObjectBucketArtifacts)
	store, err := admin.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.GetInfo(ctx, object)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutBytes(ctx, "theirs", []byte("another artifact's bytes")); err != nil {
		t.Fatal(err)
	}
	other := bus.ArtifactConsumer("node-b", "e2e")
	if _, err := bus.CreateObjectRead(ctx, admin, bus.ObjectBucketArtifacts, "theirs", 0, bus.ObjectReadConfig{Name: other, Inactive: time.Minute}); err != nil {
		t.Fatal(err)
	}
	chunks := bus.ObjectChunks(bus.ObjectBucketArtifacts, info.NUID)
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }
	creates := map[string]func(context.Context) error{
		"ephemeral pull": func(c context.Context) error {
			_, err := ljs.CreateConsumer(c, stream, jetstream.ConsumerConfig{FilterSubject: chunks})
			return err
		},
		"durable": func(c context.Context) error {
			_, err := ljs.CreateConsumer(c, stream, jetstream.ConsumerConfig{Durable: "login_durable", FilterSubject: chunks})
			return err
		},
		"push": func(c context.Context) error {
			_, err := ljs.CreatePushConsumer(c, stream, jetstream.ConsumerConfig{Name: "login_push", DeliverSubject: bus.NodeCmd("node-b"), FilterSubject: chunks})
			return err
		},
		"ordered": func(c context.Context) error {
			oc, err := ljs.OrderedConsumer(c, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{chunks}})
			if err == nil {
				_, err = oc.Next(jetstream.FetchMaxWait(time.Second))
			}
			return err
		},
		"object store": func(c context.Context) error {
			obs, err := ljs.ObjectStore(c, bus.ObjectBucketArtifacts)
			if err == nil {
				_, err = obs.GetInfo(c, object)
			}
			return err
		},
		"another object's pull": func(c context.Context) error {
			cons, err := ljs.Consumer(c, stream, other)
			if err == nil {
				_, err = cons.Next(jetstream.FetchMaxWait(time.Second))
			}
			return err
		},
	}
	for name, try := range creates {
		c, cancel := short()
		if err := try(c); err == nil {
			t.Errorf("the artifact login succeeded at: %s", name)
		}
		cancel()
	}
	nc := ljs.Conn()
	for _, subj := range []string{
		"$JS.API.DIRECT.GET." + stream + "." + bus.ObjectMeta(bus.ObjectBucketArtifacts, "theirs"),
		"$JS.API.DIRECT.GET." + stream + "." + bus.ObjectMeta(bus.ObjectBucketArtifacts, object),
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + other,
		"$JS.API.CONSUMER.DELETE." + stream + "." + other,
	} {
		if _, err := nc.Request(subj, []byte(`{"seq":1}`), 500*time.Millisecond); err == nil {
			t.Errorf("the artifact login was answered on %s", subj)
		}
		violations.denied(t, "publish", subj)
	}
	// Of all the creates, only the control plane's consumers (artifact_…) exist.
	str, err := admin.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	names := str.ConsumerNames(ctx)
	for n := range names.Name() {
		if !strings.HasPrefix(n, "artifact_") {
			t.Errorf("consumer %s exists after the artifact login's attempts", n)
		}
	}
	if ci, err := admin.Consumer(ctx, stream, other); err != nil {
		t.Fatalf("the other node's consumer: %v", err)
	} else if ci.CachedInfo().Delivered.Consumer != 0 {
		t.Fatalf("the other node's consumer delivered %d chunks", ci.CachedInfo().Delivered.Consumer)
	}
}
