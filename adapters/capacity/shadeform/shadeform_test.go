package shadeform_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/shadeform"
	"github.com/warmfleet/warmfleet/schemas"
)

const a100 = "massedcompute/us-central-2/A100_80G"

func provisionCmd(rental string, gen uint64) capacity.ProvisionCommand {
	return capacity.ProvisionCommand{
		ConnectionID: "conn-test", OperationKey: "op-" + rental, RentalID: rental, Generation: gen, OwnershipToken: "us", OfferID: a100,
		Bootstrap: schemas.NodeBootstrap{ControlPlaneURL: "nats://cp:4222", NodeID: "n-" + rental, RentalID: rental, Generation: gen,
			EnrollmentToken: "enroll-secret-" + rental},
	}
}

func TestCreateRequestShape(t *testing.T) {
	w := newWorld(t, func(c *shadeform.Config) { c.OS = "ubuntu22.04_cuda12.2_shade_os" })
	cmd := provisionCmd("r1", 3)
	cmd.MaxLifetimeSeconds = 7200
	start := w.srv.Now()
	rec, err := w.ProvisionCapacity(context.Background(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != capacity.StateProvisioning || rec.Pricing.MicrosPerHour != 180*capacity.MicrosPerCent || rec.Pricing.Exact || rec.Duplicate {
		t.Errorf("receipt %+v", rec)
	}
	in, ok := w.srv.Instance(rec.NativeRef)
	if !ok {
		t.Fatalf("server has no instance %s", rec.NativeRef)
	}
	var body map[string]any
	if err := json.Unmarshal(in.Request, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"cloud": "massedcompute", "region": "us-central-2", "shade_instance_type": "A100_80G", "shade_cloud": true,
		"name": "wf-r1-g3", "os": "ubuntu22.04_cuda12.2_shade_os",
	}
	for k, v := range want {
		if body[k] != v {
			t.Errorf("create %s = %v, want %v", k, body[k], v)
		}
	}
	lc, _ := body["launch_configuration"].(map[string]any)
	if lc["type"] != "script" {
		t.Errorf("launch_configuration %v", lc)
	}
	for _, tag := range []string{"wf-owner=us", "wf-rental=r1", "wf-generation=3", "wf-operation=op-r1", "wf-connection=conn-test"} {
		if !slices.Contains(in.Tags, tag) {
			t.Errorf("tags %v lack %s", in.Tags, tag)
		}
	}
	if wantAt := start.Add(2 * time.Hour); !in.AutoDeleteAt.Equal(wantAt) {
		t.Errorf("auto delete at %v, want %v", in.AutoDeleteAt, wantAt)
	}
	// Before creating, the adapter looked for an instance with this key.
	var paths []string
	for _, r := range w.srv.Requests() {
		if !r.Authorized {
			t.Errorf("%s %s went without the key", r.Method, r.Path)
		}
		paths = append(paths, r.Method+" "+r.Path)
	}
	if i, j := slices.Index(paths, "GET /v1/instances"), slices.Index(paths, "POST /v1/instances/create"); i < 0 || j < 0 || i > j {
		t.Errorf("requests %v: want a listing before the create", paths)
	}
}

func TestLostCreateResponseIsReconciled(t *testing.T) {
	w := newWorld(t)
	w.srv.LoseNextCreates(1)
	cmd := provisionCmd("r1", 1)
	_, err := w.ProvisionCapacity(context.Background(), cmd)
	if err == nil || !capacity.Ambiguous(err) {
		t.Fatalf("lost response: got %v, want an ambiguous error", err)
	}
	if n := w.allocationsFor("r1"); n != 1 {
		t.Fatalf("%d instances after the lost response, want 1 (the create took effect)", n)
	}
	rec, err := w.ProvisionCapacity(context.Background(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Duplicate || w.allocationsFor("r1") != 1 {
		t.Fatalf("retry: %+v with %d instances, want the first one as a duplicate", rec, w.allocationsFor("r1"))
	}
}

func TestLookAlikesAreNeverOurs(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	planted := []string{
		w.srv.AddInstance("wf-r1-g1"), // our name, no tags
		w.srv.AddInstance("wf-r1-g1", "wf-owner=them", "wf-rental=r1", "wf-generation=1", "wf-operation=op-r1"),
		w.srv.AddInstance("wf-r1-g1", "wf-owner=us", "wf-owner=them", "wf-rental=r1", "wf-operation=op-r1"),
		w.srv.AddInstance("wf-r1-g1", "wf-owner = us", "wf-rental=r1", "wf-operation=op-r1"),
		w.srv.AddInstance("wf-r1-g1", "WF-OWNER=us", "wf-rental=r1", "wf-operation=op-r1"),
	}
	// A provision with the look-alikes' operation key creates its own.
	rec, err := w.ProvisionCapacity(ctx, provisionCmd("r1", 1))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Duplicate || slices.Contains(planted, rec.NativeRef) {
		t.Fatalf("provision adopted a look-alike: %+v", rec)
	}
	owned, err := w.ListOwnedCapacity(ctx, capacity.OwnershipQuery{OwnershipToken: "us"})
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) != 1 || owned[0].NativeRef != rec.NativeRef || owned[0].OperationKey != "op-r1" || owned[0].Generation != 1 {
		t.Fatalf("owned %+v, want only %s", owned, rec.NativeRef)
	}
	for _, id := range planted {
		_, err := w.TerminateCapacity(ctx, capacity.Command{Ref: capacity.Ref{NativeRef: id, OwnershipToken: "us"}, Generation: 99})
		if !errors.Is(err, capacity.ErrNotFound) {
			t.Errorf("terminate look-alike %s: %v, want ErrNotFound", id, err)
		}
		if in, _ := w.srv.Instance(id); in.Status != "active" {
			t.Errorf("look-alike %s is %s after our refused terminate", id, in.Status)
		}
	}
}

func TestOffersFromInstanceTypes(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	offers, err := w.ListCapacity(ctx, capacity.OfferQuery{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]capacity.Offer{}
	for _, o := range offers {
		byID[o.ID] = o
	}
	a := byID[a100]
	want := capacity.Offer{ID: a100, Provider: "shadeform", Cloud: "massedcompute", Region: "us-central-2", GPUModel: "A100_80G",
		GPUCount: 1, GPUMemoryBytes: 80 << 30, CPUMillis: 16000, MemoryBytes: 128 << 30, DiskBytes: 512 << 30,
		PricePerHour: capacity.Price{Currency: "USD", MicrosPerHour: 1_800_000}, Available: true, ReadySeconds: 300}
	if a != want {
		t.Errorf("A100 offer\n got %+v\nwant %+v", a, want)
	}
	if o, ok := byID["massedcompute/us-east-1/A100_80G"]; !ok || o.Available {
		t.Errorf("out-of-stock region: %+v (listed %v), want listed and unavailable", o, ok)
	}
	if _, ok := byID["massedcompute/eu-west-1/A100_80G"]; ok {
		t.Errorf("a spot-only region was offered as on-demand")
	}
	if len(offers) != 4 {
		t.Errorf("%d offers, want 4: %v", len(offers), offers)
	}

	h100, err := w.ListCapacity(ctx, capacity.OfferQuery{AvailableOnly: true, GPU: &schemas.GPURequirement{Model: "h100"},
		Resources: schemas.Resources{GPUCount: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h100) != 1 || h100[0].ID != "hyperstack/canada-1/H100_sxm5x8" {
		t.Errorf("8xH100 query: %+v", h100)
	}
	if len(h100) == 1 && h100[0].ReadySeconds != 0 {
		t.Errorf("a type without a boot-time estimate got ReadySeconds %d", h100[0].ReadySeconds)
	}
	reqs := w.srv.Requests()
	if last := reqs[len(reqs)-1]; last.Query != "available=true" {
		t.Errorf("AvailableOnly sent query %q", last.Query)
	}
}

func TestObservationIsShadeformsAccount(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	cmd := provisionCmd("r1", 1)
	created := w.srv.Now()
	rec, err := w.ProvisionCapacity(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	ref := cmd.Ref(rec.NativeRef)
	w.srv.Advance(20 * time.Second)
	obs, err := w.ObserveCapacity(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if obs.State != capacity.StateProvisioning || !obs.StateSince.Equal(created) || !obs.ObservedAt.Equal(created.Add(20*time.Second)) {
		t.Errorf("pending: %+v, want provisioning since %v", obs, created)
	}
	w.srv.Advance(10 * time.Minute)
	obs, err = w.ObserveCapacity(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	// Running since Shadeform's active_at, not since our look.
	if obs.State != capacity.StateRunning || !obs.StateSince.Equal(created.Add(time.Minute)) || obs.Endpoint == "" {
		t.Errorf("active: %+v, want running since %v with an endpoint", obs, created.Add(time.Minute))
	}
	// The record repeats Shadeform's facts and never our startup script.
	for _, secret := range []string{"launch_configuration", "base64_script", "enroll-secret-r1",
		base64.StdEncoding.EncodeToString([]byte("enroll"))[:6]} {
		if strings.Contains(obs.NativeJSON, secret) {
			t.Errorf("NativeJSON carries %q: %s", secret, obs.NativeJSON)
		}
	}
	if !strings.Contains(obs.NativeJSON, `"status":"active"`) {
		t.Errorf("NativeJSON lacks the status: %s", obs.NativeJSON)
	}
}

func TestTerminateUnknownInstanceIsDuplicate(t *testing.T) {
	w := newWorld(t)
	rec, err := w.TerminateCapacity(context.Background(), capacity.Command{Ref: capacity.Ref{NativeRef: "no-such", OwnershipToken: "us"}, Generation: 1})
	if err != nil || !rec.Duplicate || rec.State != capacity.StateTerminated {
		t.Fatalf("got %+v, %v; want a duplicate terminated receipt", rec, err)
	}
}

func TestStartupScriptInstallsBootstrapPrivately(t *testing.T) {
	w := newWorld(t)
	cmd := provisionCmd("r1", 1)
	rec, err := w.ProvisionCapacity(context.Background(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	root, err := w.srv.Boot(rec.NativeRef, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, shadeform.BootstrapPath)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(cmd.Bootstrap)
	if string(got) != string(want) {
		t.Errorf("bootstrap file %q, want %q", got, want)
	}
	for p, mode := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode().Perm(), err, mode)
		}
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".bootstrap.*")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

func TestKeySources(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == shadeform.EnvAPIKey {
				return v
			}
			return ""
		}
	}
	good := []shadeform.Config{
		{Getenv: env(testKey)},
		{APIKeyFile: keyFile, Getenv: env("wrong")},
		{APIKey: shadeform.NewAPIKey(testKey), APIKeyFile: filepath.Join(dir, "missing")},
	}
	for i, cfg := range good {
		cfg.BaseURL = w.srv.BaseURL
		p, err := shadeform.New(cfg)
		if err != nil {
			t.Fatalf("config %d: %v", i, err)
		}
		if err := p.Verify(ctx); err != nil {
			t.Errorf("config %d: Verify: %v", i, err)
		}
	}
	bad := []shadeform.Config{
		{Getenv: env("")},
		{APIKeyFile: filepath.Join(dir, "missing")},
		{APIKeyFile: os.DevNull},
	}
	for i, cfg := range bad {
		if _, err := shadeform.New(cfg); !errors.Is(err, capacity.ErrUnauthorized) {
			t.Errorf("bad config %d: got %v, want ErrUnauthorized", i, err)
		}
	}
	p, err := shadeform.New(shadeform.Config{BaseURL: w.srv.BaseURL, Getenv: env("not-the-key")})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx); !errors.Is(err, capacity.ErrUnauthorized) {
		t.Errorf("wrong key: got %v, want ErrUnauthorized", err)
	}
}

func TestBaseURLMustBeHTTPWithoutCredentials(t *testing.T) {
	for _, u := range []string{"ftp://api.example", "https://user:hunter2@api.example/v1", "not a url", "https://"} {
		_, err := shadeform.New(shadeform.Config{BaseURL: u, APIKey: shadeform.NewAPIKey(testKey)})
		if !errors.Is(err, capacity.ErrInvalid) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("base URL %q: %v", u, err)
		}
	}
}

func TestStaleProvisionIsRefused(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if _, err := w.ProvisionCapacity(ctx, provisionCmd("r1", 5)); err != nil {
		t.Fatal(err)
	}
	old := provisionCmd("r1", 4)
	old.OperationKey = "op-r1-old"
	if _, err := w.ProvisionCapacity(ctx, old); !errors.Is(err, capacity.ErrStaleGeneration) {
		t.Fatalf("provision at generation 4 after 5: %v", err)
	}
	if n := w.allocationsFor("r1"); n != 1 {
		t.Fatalf("%d instances, want 1", n)
	}
}
