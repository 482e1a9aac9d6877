// Package serverlesstest is an in-process stand-in for RunPod's
// serverless queue API (/v2/<endpoint>/run, status, cancel, purge-queue,
// health), in the documented shapes, on an httptest.Server. Jobs live on
// a virtual clock: they wait for a worker, run, and complete with their
// input echoed as output, time out at their policy's executionTimeout or
// ttl, and can be held in the queue or have a launch's answer lost.
//
// It shares no code with the executor on purpose.
package serverlesstest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a fake RunPod serverless API.
type Server struct {
	*httptest.Server
	// BaseURL is the API root (URL + "/v2").
	BaseURL string

	key string

	mu        sync.Mutex
	now       time.Time
	runFor    time.Duration
	endpoints map[string]*endpoint
	jobs      map[string]*Job
	seq       int
	lose      int
}

type endpoint struct {
	workers int
}

// Job is one job as the server keeps it.
type Job struct {
	ID       string
	Endpoint string
	Input    json.RawMessage
	Status   string
	queuedAt time.Time
	started  time.Time
	timeout  time.Duration
	ttl      time.Duration
}

// New starts a server that accepts key, with the given endpoints, each
// with one idle worker.
func New(t testing.TB, key string, endpoints ...string) *Server {
	s := &Server{key: key, now: time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC), runFor: 20 * time.Second,
		endpoints: map[string]*endpoint{}, jobs: map[string]*Job{}}
	for _, e := range endpoints {
		s.endpoints[e] = &endpoint{workers: 1}
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	s.BaseURL = s.URL + "/v2"
	return s
}

// Now is the server's clock; Advance moves it.
func (s *Server) Now() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now }

// Advance moves the clock forward.
func (s *Server) Advance(d time.Duration) { s.mu.Lock(); s.now = s.now.Add(d); s.mu.Unlock() }

// Workers sets an endpoint's workers: 0 holds every job in the queue.
func (s *Server) Workers(endpoint string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints[endpoint].workers = n
}

// LoseNextRun queues the next n jobs and answers 502, as a lost answer.
func (s *Server) LoseNextRun(n int) { s.mu.Lock(); s.lose += n; s.mu.Unlock() }

// Jobs counts every job ever queued.
func (s *Server) Jobs() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.jobs) }

// advance moves every job along the clock: a queued job starts when its
// endpoint has a worker free, a running one completes after runFor or
// times out at its executionTimeout, a queued one past its ttl times out.
func (s *Server) advance() {
	busy := map[string]int{}
	for _, j := range s.jobs {
		if j.Status == "IN_PROGRESS" {
			switch {
			case j.timeout > 0 && s.now.Sub(j.started) > j.timeout && s.runFor > j.timeout:
				j.Status = "TIMED_OUT"
			case !s.now.Before(j.started.Add(s.runFor)):
				j.Status = "COMPLETED"
				if strings.Contains(string(j.Input), `"fail"`) {
					j.Status = "FAILED"
				}
			default:
				busy[j.Endpoint]++
			}
		}
	}
	for i := 1; i <= s.seq; i++ {
		j := s.jobs[fmt.Sprintf("job-%06d", i)]
		if j == nil || j.Status != "IN_QUEUE" {
			continue
		}
		if j.ttl > 0 && s.now.Sub(j.queuedAt) > j.ttl {
			j.Status = "TIMED_OUT"
			continue
		}
		if busy[j.Endpoint] < s.endpoints[j.Endpoint].workers {
			busy[j.Endpoint]++
			j.Status, j.started = "IN_PROGRESS", s.now
		}
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+s.key {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
	ep, ok := s.endpoints[parts[0]]
	if !ok || len(parts) < 2 {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "endpoint not found"})
		return
	}
	s.advance()
	switch {
	case parts[1] == "run" && r.Method == http.MethodPost:
		s.run(w, r, parts[0])
	case parts[1] == "health" && r.Method == http.MethodGet:
		var h struct {
			Jobs    map[string]int `json:"jobs"`
			Workers map[string]int `json:"workers"`
		}
		h.Jobs, h.Workers = map[string]int{"inQueue": 0, "inProgress": 0, "completed": 0, "failed": 0, "retried": 0}, map[string]int{"idle": 0, "running": 0}
		for _, j := range s.jobs {
			if j.Endpoint == parts[0] {
				switch j.Status {
				case "IN_QUEUE":
					h.Jobs["inQueue"]++
				case "IN_PROGRESS":
					h.Jobs["inProgress"]++
				}
			}
		}
		h.Workers["running"] = h.Jobs["inProgress"]
		h.Workers["idle"] = max(ep.workers-h.Jobs["inProgress"], 0)
		writeJSON(w, http.StatusOK, h)
	case parts[1] == "purge-queue" && r.Method == http.MethodPost:
		n := 0
		for _, j := range s.jobs {
			if j.Endpoint == parts[0] && j.Status == "IN_QUEUE" {
				j.Status = "CANCELLED"
				n++
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"removed": n, "status": "completed"})
	case (parts[1] == "status" && r.Method == http.MethodGet || parts[1] == "cancel" && r.Method == http.MethodPost) && len(parts) == 3:
		j, ok := s.jobs[parts[2]]
		if !ok || j.Endpoint != parts[0] {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "job not found"})
			return
		}
		if parts[1] == "cancel" && (j.Status == "IN_QUEUE" || j.Status == "IN_PROGRESS") {
			j.Status = "CANCELLED"
		}
		writeJSON(w, http.StatusOK, s.status(j))
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no route"})
	}
}

func (s *Server) run(w http.ResponseWriter, r *http.Request, endpoint string) {
	var in struct {
		Input  json.RawMessage `json:"input"`
		Policy struct {
			ExecutionTimeout int64 `json:"executionTimeout"`
			TTL              int64 `json:"ttl"`
		} `json:"policy"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Input) == 0 || in.Input[0] != '{' {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "input must be an object"})
		return
	}
	s.seq++
	j := &Job{ID: fmt.Sprintf("job-%06d", s.seq), Endpoint: endpoint, Input: in.Input, Status: "IN_QUEUE", queuedAt: s.now,
		timeout: time.Duration(in.Policy.ExecutionTimeout) * time.Millisecond, ttl: time.Duration(in.Policy.TTL) * time.Millisecond}
	s.jobs[j.ID] = j
	s.advance()
	if s.lose > 0 {
		s.lose--
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": j.ID, "status": "IN_QUEUE"})
}

func (s *Server) status(j *Job) map[string]any {
	out := map[string]any{"id": j.ID, "status": j.Status}
	if !j.started.IsZero() {
		out["delayTime"] = j.started.Sub(j.queuedAt).Milliseconds()
		end := s.now
		if j.Status == "COMPLETED" || j.Status == "FAILED" {
			end = j.started.Add(s.runFor)
		}
		out["executionTime"] = end.Sub(j.started).Milliseconds()
	}
	switch j.Status {
	case "COMPLETED":
		var in struct {
			Command []string `json:"command"`
		}
		_ = json.Unmarshal(j.Input, &in)
		out["output"] = map[string]string{"echo": strings.Join(in.Command, " ")}
	case "FAILED":
		out["error"] = "handler raised"
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
