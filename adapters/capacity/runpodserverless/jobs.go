package runpodserverless

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/warmfleet/warmfleet/adapters/capacity"
	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// wireRun is the body of POST /<endpoint>/run.
type wireRun struct {
	Input  wireInput  `json:"input"`
	Policy wirePolicy `json:"policy"`
}

// wireInput is what the worker receives: the Run's command and the marks
// that name the launch.
type wireInput struct {
	ephemeral.Input
	Warmfleet wireMarks `json:"warmfleet"`
}

type wireMarks struct {
	LaunchKey string `json:"launch_key"`
	RunID     string `json:"run_id"`
	Attempt   int    `json:"attempt"`
	Owner     string `json:"owner"`
}

// wirePolicy bounds a job (milliseconds).
type wirePolicy struct {
	ExecutionTimeout int64 `json:"executionTimeout,omitempty"`
	TTL              int64 `json:"ttl,omitempty"`
}

// wireJob is a job's status.
type wireJob struct {
	ID            string          `json:"id"`
	Status        string          `json:"status"`
	DelayTime     float64         `json:"delayTime"`
	ExecutionTime float64         `json:"executionTime"`
	Output        json.RawMessage `json:"output"`
	Error         json.RawMessage `json:"error"`
}

// wireHealth is an endpoint's health.
type wireHealth struct {
	Jobs struct {
		InQueue    int `json:"inQueue"`
		InProgress int `json:"inProgress"`
	} `json:"jobs"`
	Workers struct {
		Idle    int `json:"idle"`
		Running int `json:"running"`
	} `json:"workers"`
}

// decodeJob reads a job's status.
func decodeJob(b []byte) (wireJob, error) {
	var j wireJob
	if err := json.Unmarshal(b, &j); err != nil {
		return wireJob{}, err
	}
	if j.ID == "" {
		return wireJob{}, errors.New("job without an id")
	}
	return j, nil
}

// stateOf maps RunPod's job status.
func stateOf(status string) ephemeral.State {
	switch status {
	case "IN_QUEUE":
		return ephemeral.StateQueued
	case "IN_PROGRESS":
		return ephemeral.StateRunning
	case "COMPLETED":
		return ephemeral.StateSucceeded
	case "FAILED":
		return ephemeral.StateFailed
	case "CANCELLED":
		return ephemeral.StateCancelled
	case "TIMED_OUT":
		return ephemeral.StateTimedOut
	}
	return ephemeral.StateUnknown
}

// execution is what a job's status says, its output bounded.
func execution(j wireJob, e *Executor) ephemeral.Execution {
	x := ephemeral.Execution{ExecutionID: j.ID, State: stateOf(j.Status), ObservedAt: e.now()}
	if j.DelayTime > 0 && j.DelayTime < 1e12 {
		x.QueueSeconds = j.DelayTime / 1000
	}
	if j.ExecutionTime > 0 && j.ExecutionTime < 1e12 {
		x.RunSeconds = j.ExecutionTime / 1000
	}
	if out := j.Output; len(out) > 0 && string(out) != "null" {
		if len(out) > ephemeral.MaxOutputBytes {
			out, x.Truncated = out[:ephemeral.MaxOutputBytes], true
		}
		x.Output = append([]byte(nil), out...)
	}
	if len(j.Error) > 0 && string(j.Error) != "null" {
		var s string
		if json.Unmarshal(j.Error, &s) != nil {
			s = string(j.Error)
		}
		x.Error = strings.ToValidUTF8(s[:min(len(s), 1024)], "?")
	}
	return x
}

// Launch sends a job to the offer's endpoint, the launch key in its input
// and the Run's limits as its policy.
func (e *Executor) Launch(ctx context.Context, req ephemeral.LaunchRequest) (ephemeral.LaunchReceipt, error) {
	const op = "launch"
	if err := req.Validate(); err != nil {
		return ephemeral.LaunchReceipt{}, err
	}
	if _, ok := e.endpoint(req.OfferID); !ok {
		return ephemeral.LaunchReceipt{}, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: req.LaunchKey, Message: "offer_id names no configured endpoint"}
	}
	body := wireRun{Input: wireInput{Input: req.Input, Warmfleet: wireMarks{LaunchKey: req.LaunchKey, RunID: req.RunID, Attempt: req.Attempt, Owner: req.OwnershipToken}},
		Policy: wirePolicy{ExecutionTimeout: req.ExecutionTimeoutSeconds * 1000, TTL: req.TTLSeconds * 1000}}
	b, err := e.api.Call(ctx, op, req.LaunchKey, http.MethodPost, "/"+url.PathEscape(req.OfferID)+"/run", body)
	if err != nil {
		return ephemeral.LaunchReceipt{}, err
	}
	j, err := decodeJob(b)
	if err != nil {
		return ephemeral.LaunchReceipt{}, e.api.DecodeError(op, req.LaunchKey, err)
	}
	return ephemeral.LaunchReceipt{ExecutionID: j.ID, State: stateOf(j.Status), AcceptedAt: e.now()}, nil
}

// Observe reads a job's status.
func (e *Executor) Observe(ctx context.Context, ref ephemeral.Ref) (ephemeral.Execution, error) {
	j, err := e.job(ctx, "observe", ref, http.MethodGet, "/status/")
	if err != nil {
		return ephemeral.Execution{}, err
	}
	return execution(j, e), nil
}

// Release cancels a job, queued or running; one already ended is left as
// it is.
func (e *Executor) Release(ctx context.Context, ref ephemeral.Ref) (ephemeral.Receipt, error) {
	j, err := e.job(ctx, "release", ref, http.MethodGet, "/status/")
	if err != nil {
		return ephemeral.Receipt{}, err
	}
	if s := stateOf(j.Status); s.Ended() {
		return ephemeral.Receipt{ExecutionID: j.ID, State: s, Duplicate: true}, nil
	}
	if j, err = e.job(ctx, "release", ref, http.MethodPost, "/cancel/"); err != nil {
		return ephemeral.Receipt{}, err
	}
	return ephemeral.Receipt{ExecutionID: j.ID, State: stateOf(j.Status)}, nil
}

// Terminate is unsupported: an endpoint's workers are a standing pool.
func (e *Executor) Terminate(context.Context, ephemeral.Ref) (ephemeral.Receipt, error) {
	return ephemeral.Receipt{}, &capacity.Error{Code: capacity.CodeUnsupported, Provider: Type, Op: "terminate", Message: "a serverless endpoint is a standing pool; release the execution"}
}

// ListOwned is unsupported: RunPod lists no endpoint's jobs.
func (e *Executor) ListOwned(context.Context, capacity.OwnershipQuery) ([]ephemeral.Owned, error) {
	return nil, &capacity.Error{Code: capacity.CodeUnsupported, Provider: Type, Op: "list_owned", Message: "RunPod serverless lists no jobs"}
}

// PurgeQueue drops every job still queued on an endpoint (RunPod's
// purge-queue): for an operator emptying a pool, never for one Run.
func (e *Executor) PurgeQueue(ctx context.Context, endpointID string) (int, error) {
	b, err := e.api.Call(ctx, "purge", endpointID, http.MethodPost, "/"+url.PathEscape(endpointID)+"/purge-queue", nil)
	if err != nil {
		return 0, err
	}
	var r struct {
		Removed int `json:"removed"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, e.api.DecodeError("purge", endpointID, err)
	}
	return r.Removed, nil
}

// job calls one job's path (/status/, /cancel/).
func (e *Executor) job(ctx context.Context, op string, ref ephemeral.Ref, method, path string) (wireJob, error) {
	if err := ref.Validate(); err != nil {
		return wireJob{}, err
	}
	if _, ok := e.endpoint(ref.OfferID); !ok {
		return wireJob{}, &capacity.Error{Code: capacity.CodeNotFound, Provider: Type, Op: op, Ref: ref.ExecutionID, Message: "offer_id names no configured endpoint"}
	}
	b, err := e.api.Call(ctx, op, ref.ExecutionID, method, "/"+url.PathEscape(ref.OfferID)+path+url.PathEscape(ref.ExecutionID), nil)
	if err != nil {
		return wireJob{}, err
	}
	j, err := decodeJob(b)
	if err != nil {
		return wireJob{}, e.api.DecodeError(op, ref.ExecutionID, err)
	}
	if j.ID != ref.ExecutionID {
		return wireJob{}, &capacity.Error{Provider: Type, Op: op, Ref: ref.ExecutionID, Message: "answer names another job"}
	}
	return j, nil
}

// health reads an endpoint's health.
func (e *Executor) health(ctx context.Context, op, id string) (wireHealth, error) {
	b, err := e.api.Call(ctx, op, id, http.MethodGet, "/"+url.PathEscape(id)+"/health", nil)
	if err != nil {
		return wireHealth{}, err
	}
	var h wireHealth
	if err := json.Unmarshal(b, &h); err != nil {
		return wireHealth{}, e.api.DecodeError(op, id, err)
	}
	return h, nil
}
