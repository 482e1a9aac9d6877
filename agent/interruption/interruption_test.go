package interruption

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notice")
	n, err := File(path).Check(context.Background())
	if err != nil || n != nil {
		t.Fatalf("absent file: %+v, %v", n, err)
	}
	if err := os.WriteFile(path, []byte("2030-01-02T03:04:05Z\nreclaiming\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err = File(path).Check(context.Background())
	if err != nil || n == nil || n.Source != "file" || !n.At.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) || !strings.Contains(n.Detail, "reclaiming") {
		t.Fatalf("notice %+v, %v", n, err)
	}
	if err := os.WriteFile(path, []byte(strings.Repeat("\xff", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err = File(path).Check(context.Background())
	if err != nil || n == nil || n.Validate() != nil {
		t.Fatalf("an oversized, invalid notice must still be a valid one: %+v, %v", n, err)
	}
}

// TestURL serves the two metadata shapes the agent reads: AWS's
// instance-action (404, then a JSON action) and GCE's preempted (FALSE,
// then TRUE, with its header required).
func TestURL(t *testing.T) {
	var aws, gce string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/latest/meta-data/spot/instance-action":
			if aws == "" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(aws))
		case "/computeMetadata/v1/instance/preempted":
			if r.Header.Get("Metadata-Flavor") != "Google" {
				w.WriteHeader(http.StatusForbidden)
				return
			}
			_, _ = w.Write([]byte(gce))
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	a := URL{Address: srv.URL + "/latest/meta-data/spot/instance-action"}
	if n, err := a.Check(ctx); n != nil || err != nil {
		t.Fatalf("no notice yet: %+v, %v", n, err)
	}
	aws = `{"action": "terminate", "time": "2030-01-02T03:04:05Z"}`
	if n, err := a.Check(ctx); err != nil || n == nil || n.Source != "url" || n.At.IsZero() {
		t.Fatalf("aws notice: %+v, %v", n, err)
	}
	g := URL{Address: srv.URL + "/computeMetadata/v1/instance/preempted", Header: http.Header{"Metadata-Flavor": {"Google"}}}
	gce = "FALSE"
	if n, err := g.Check(ctx); n != nil || err != nil {
		t.Fatalf("gce not preempted: %+v, %v", n, err)
	}
	gce = "TRUE"
	if n, err := g.Check(ctx); err != nil || n == nil || n.Detail != "TRUE" {
		t.Fatalf("gce notice: %+v, %v", n, err)
	}
	if n, err := (URL{Address: srv.URL + "/broken"}).Check(ctx); err == nil || n != nil {
		t.Fatalf("a failed look is an error, not a notice: %+v, %v", n, err)
	}
}
