// Package runpodtest is an in-process stand-in for RunPod's API, for tests
// of the runpod adapter: the REST pods API under /v1 and the GraphQL
// gpuTypes query under /graphql, in the documented shapes, on an
// httptest.Server. Pods live on a virtual clock; the server can be told to
// fail (out of stock, rate limited, a lost answer) and can take an
// interruptible pod back as RunPod's spot market does.
//
// It shares no code with the adapter on purpose, so a shape the adapter
// gets wrong is a shape this server disagrees with.
package runpodtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// GPUType is one gpuTypes entry the server lists.
type GPUType struct {
	ID                 string  `json:"id"`
	DisplayName        string  `json:"displayName"`
	MemoryInGb         float64 `json:"memoryInGb"`
	SecureCloud        bool    `json:"secureCloud"`
	CommunityCloud     bool    `json:"communityCloud"`
	SecurePrice        float64 `json:"securePrice"`
	CommunityPrice     float64 `json:"communityPrice"`
	SecureSpotPrice    float64 `json:"secureSpotPrice"`
	CommunitySpotPrice float64 `json:"communitySpotPrice"`
	// OutOfStock makes every create of this type fail as RunPod does.
	OutOfStock bool `json:"-"`
}

// DefaultGPUTypes is a small catalogue: two types with spot prices, one
// always out of stock.
func DefaultGPUTypes() []GPUType {
	return []GPUType{
		{ID: "NVIDIA A100 80GB PCIe", DisplayName: "A100 PCIe", MemoryInGb: 80, SecureCloud: true, CommunityCloud: true,
			SecurePrice: 1.64, CommunityPrice: 1.19, SecureSpotPrice: 0.82, CommunitySpotPrice: 0.6},
		{ID: "NVIDIA H100 80GB HBM3", DisplayName: "H100 SXM", MemoryInGb: 80, SecureCloud: true, SecurePrice: 2.99, SecureSpotPrice: 1.75},
		{ID: "NVIDIA B200", DisplayName: "B200", MemoryInGb: 180, SecureCloud: true, SecurePrice: 5.99, OutOfStock: true},
	}
}

// Pod is a pod as the server keeps it.
type Pod struct {
	ID                string            `json:"id"`
	Name              string            `json:"name"`
	Image             string            `json:"image"`
	DesiredStatus     string            `json:"desiredStatus"`
	CostPerHr         string            `json:"costPerHr"`
	AdjustedCostPerHr float64           `json:"adjustedCostPerHr"`
	Interruptible     bool              `json:"interruptible"`
	LastStartedAt     string            `json:"lastStartedAt,omitempty"`
	LastStatusChange  string            `json:"lastStatusChange"`
	Env               map[string]string `json:"env"`
	MachineID         string            `json:"machineId"`
	GPU               struct {
		ID    string `json:"id"`
		Count int    `json:"count"`
	} `json:"gpu"`
	VolumeInGb int `json:"volumeInGb"`

	startsAt time.Time
}

// Server is a fake RunPod API. Its clock starts at a fixed time and moves
// only with Advance.
type Server struct {
	*httptest.Server
	// BaseURL is the REST root (URL + "/v1"), GraphQLURL the GraphQL one.
	BaseURL, GraphQLURL string

	key string

	mu       sync.Mutex
	now      time.Time
	boot     time.Duration
	types    []GPUType
	pods     map[string]*Pod
	created  []Pod // every create, deleted pods too
	seq      int
	failures []failure
	lose     int
}

type failure struct {
	method, prefix string
	status         int
	body           string
	header         http.Header
}

// New starts a server that accepts key as its API key.
func New(t testing.TB, key string) *Server {
	s := &Server{key: key, now: time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC), boot: 45 * time.Second,
		types: DefaultGPUTypes(), pods: map[string]*Pod{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	s.BaseURL, s.GraphQLURL = s.URL+"/v1", s.URL+"/graphql"
	return s
}

// Now is the server's clock; Advance moves it.
func (s *Server) Now() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now }

// Advance moves the clock forward.
func (s *Server) Advance(d time.Duration) { s.mu.Lock(); s.now = s.now.Add(d); s.mu.Unlock() }

// Fail makes the next request whose method matches and whose path starts
// with prefix answer status with body (and header).
func (s *Server) Fail(method, prefix string, status int, body string, header http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = append(s.failures, failure{method, prefix, status, body, header})
}

// LoseNext applies the next n mutating requests and then answers 502, as
// if the answer were lost on its way back.
func (s *Server) LoseNext(n int) { s.mu.Lock(); s.lose += n; s.mu.Unlock() }

// Interrupt takes an interruptible pod back as RunPod's spot market does:
// it is stopped, saying it was outbid. It reports whether it did.
func (s *Server) Interrupt(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pods[id]
	if !ok || !p.Interruptible || p.DesiredStatus != "RUNNING" {
		return false
	}
	p.DesiredStatus, p.LastStatusChange = "EXITED", "Outbid: spot pod reclaimed "+s.now.Format(time.RFC3339)
	return true
}

// Received is the bootstrap a pod was given, decoded from its environment.
func (s *Server) Received(id string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.created {
		if p.ID == id {
			b, err := base64.StdEncoding.DecodeString(p.Env["WARMFLEET_BOOTSTRAP"])
			return b, err == nil
		}
	}
	return nil, false
}

// Created counts the pods ever created with env[key] == value.
func (s *Server) Created(key, value string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.created {
		if p.Env[key] == value {
			n++
		}
	}
	return n
}

// PlantForeign creates a running pod that is someone else's: it carries
// owner and may copy one of our rental ids.
func (s *Server) PlantForeign(rental, owner string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.newPod("wf-"+rental+"-g1", s.types[0].ID, 1, false, map[string]string{"WARMFLEET_OWNER": owner, "WARMFLEET_RENTAL": rental,
		"WARMFLEET_OPERATION_KEY": "foreign-" + rental, "WARMFLEET_GENERATION": "1"})
	p.LastStartedAt = s.now.Format(time.RFC3339Nano)
	return p.ID
}

func (s *Server) newPod(name, gpuType string, count int, spot bool, env map[string]string) *Pod {
	s.seq++
	p := &Pod{ID: fmt.Sprintf("pod%011d", s.seq), Name: name, Image: "agent", DesiredStatus: "RUNNING", Interruptible: spot, Env: env,
		MachineID: "m" + strconv.Itoa(s.seq), LastStatusChange: "Rented by User: " + s.now.Format(time.RFC1123), startsAt: s.now.Add(s.boot), VolumeInGb: 100}
	p.GPU.ID, p.GPU.Count = gpuType, count
	price := 0.0
	for _, t := range s.types {
		if t.ID == gpuType {
			price = t.SecurePrice
			if spot {
				price = t.SecureSpotPrice
			}
		}
	}
	p.CostPerHr = strconv.FormatFloat(price*float64(count), 'f', 2, 64)
	p.AdjustedCostPerHr = price * float64(count)
	s.pods[p.ID] = p
	s.created = append(s.created, *p)
	return p
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+s.key {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized: invalid api key"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.failures {
		if f.method == r.Method && strings.HasPrefix(r.URL.Path, f.prefix) {
			s.failures = slices.Delete(s.failures, i, i+1)
			for k, vs := range f.header {
				w.Header()[k] = vs
			}
			w.WriteHeader(f.status)
			_, _ = w.Write([]byte(f.body))
			return
		}
	}
	for _, p := range s.pods {
		if p.DesiredStatus == "RUNNING" && p.LastStartedAt == "" && !s.now.Before(p.startsAt) {
			p.LastStartedAt = p.startsAt.Format(time.RFC3339Nano)
		}
	}
	rec := &recorder{ResponseWriter: w}
	s.route(rec, r)
	if r.Method != http.MethodGet && s.lose > 0 && rec.status < 300 {
		s.lose--
		// The change is made; the answer is lost.
		rec.lost = true
	}
	rec.flush()
}

func (s *Server) route(w *recorder, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/graphql" && r.Method == http.MethodPost:
		var q struct {
			Query string `json:"query"`
		}
		if json.NewDecoder(r.Body).Decode(&q) != nil || !strings.Contains(q.Query, "gpuTypes") {
			writeJSON(w, http.StatusOK, map[string]any{"errors": []map[string]string{{"message": "unsupported query"}}})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"data": map[string]any{"gpuTypes": s.types}})
	case path == "/v1/pods" && r.Method == http.MethodGet:
		list := make([]Pod, 0, len(s.pods))
		for _, p := range s.pods {
			list = append(list, *p)
		}
		slices.SortFunc(list, func(a, b Pod) int { return strings.Compare(a.ID, b.ID) })
		writeJSON(w, http.StatusOK, list)
	case path == "/v1/pods" && r.Method == http.MethodPost:
		s.create(w, r)
	case strings.HasPrefix(path, "/v1/pods/"):
		id, action, _ := strings.Cut(strings.TrimPrefix(path, "/v1/pods/"), "/")
		p, ok := s.pods[id]
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "pod not found"})
			return
		}
		switch {
		case r.Method == http.MethodGet && action == "":
			writeJSON(w, http.StatusOK, p)
		case r.Method == http.MethodDelete && action == "":
			delete(s.pods, id)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPost && action == "stop":
			p.DesiredStatus, p.LastStatusChange = "EXITED", "Exited by user: "+s.now.Format(time.RFC1123)
			writeJSON(w, http.StatusOK, p)
		case r.Method == http.MethodPost && action == "start":
			if p.DesiredStatus != "RUNNING" {
				p.DesiredStatus, p.LastStartedAt, p.startsAt = "RUNNING", "", s.now.Add(s.boot)
			}
			writeJSON(w, http.StatusOK, p)
		default:
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
		}
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no route"})
	}
}

func (s *Server) create(w *recorder, r *http.Request) {
	var in struct {
		Name              string            `json:"name"`
		ImageName         string            `json:"imageName"`
		GPUTypeIDs        []string          `json:"gpuTypeIds"`
		GPUCount          int               `json:"gpuCount"`
		Interruptible     bool              `json:"interruptible"`
		CloudType         string            `json:"cloudType"`
		ContainerDiskInGb int               `json:"containerDiskInGb"`
		VolumeInGb        int               `json:"volumeInGb"`
		VolumeMountPath   string            `json:"volumeMountPath"`
		Env               map[string]string `json:"env"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || in.Name == "" || in.ImageName == "" || len(in.GPUTypeIDs) == 0 || in.GPUCount < 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("invalid pod: %v", err)})
		return
	}
	i := slices.IndexFunc(s.types, func(t GPUType) bool { return t.ID == in.GPUTypeIDs[0] })
	switch {
	case i < 0:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown gpu type " + in.GPUTypeIDs[0]})
		return
	case s.types[i].OutOfStock || in.Interruptible && s.types[i].SecureSpotPrice == 0:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "There are no longer any instances available with the requested specifications. Please refresh and try again."})
		return
	}
	writeJSON(w, http.StatusCreated, s.newPod(in.Name, in.GPUTypeIDs[0], in.GPUCount, in.Interruptible, in.Env))
}

// recorder holds an answer so a lost one can be replaced after the fact.
type recorder struct {
	http.ResponseWriter
	status int
	body   []byte
	lost   bool
}

func (r *recorder) WriteHeader(code int)        { r.status = code }
func (r *recorder) Write(b []byte) (int, error) { r.body = append(r.body, b...); return len(b), nil }

func (r *recorder) flush() {
	if r.lost {
		r.ResponseWriter.WriteHeader(http.StatusBadGateway)
		return
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.ResponseWriter.WriteHeader(r.status)
	_, _ = r.ResponseWriter.Write(r.body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
