// Package output ships workloads' output from their node to WF_LOGS. An
// attempt's output lives in <data dir>/output/<attempt id> (package
// nodelog's layout), written by the runtime's log writer and shipped from
// there by a Shipment in whole-line chunks, each span journaled before it
// is sent and its acknowledgement after. The directory is kept until
// JetStream has acknowledged every byte and the attempt's exit is
// reported; only then is it removed. A restarted agent ships every
// directory it finds, from what its journal says was acknowledged.
package output

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/warmfleet/warmfleet/bus"
)

// meta names whose output a directory holds; it is written before the
// workload is launched, so a directory always says where it ships.
type meta struct {
	// RunID is the Run of an attempt's output; empty for a session's.
	RunID string `json:"run_id,omitempty"`
	// AttemptID is the workload id (the Wf-Attempt header).
	AttemptID string `json:"attempt_id"`
	Subject   string `json:"subject"`
}

const metaFile = "meta.json"

// Root is where every output directory of an agent's data dir lives.
func Root(dataDir string) string { return filepath.Join(dataDir, "output") }

// PrepareRun creates the output directory of a Run's attempt under an
// agent's data dir, with what it needs to be shipped to the Run's log
// subject (under the Run's tenant), and returns it.
func PrepareRun(dataDir, tenant, runID, attemptID string) (string, error) {
	return prepare(dataDir, meta{RunID: runID, AttemptID: attemptID, Subject: bus.RunLogsSubject(tenant, runID)})
}

// PrepareSession creates the output directory of a resident session's
// workload, shipped to its session's log subject, and returns it.
func PrepareSession(dataDir, workloadID, tenant, session string) (string, error) {
	return prepare(dataDir, meta{AttemptID: workloadID, Subject: bus.SessionLogsSubject(tenant, session)})
}

func prepare(dataDir string, m meta) (string, error) {
	dir := filepath.Join(Root(dataDir), m.AttemptID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("output: dir: %w", err)
	}
	b, _ := json.Marshal(m)
	tmp := filepath.Join(dir, metaFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return "", fmt.Errorf("output: meta: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, metaFile)); err != nil {
		return "", fmt.Errorf("output: meta: %w", err)
	}
	return dir, nil
}

func readMeta(dir string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Subject == "" || m.AttemptID == "" {
		return m, fmt.Errorf("output: %s: not an output meta (%v)", dir, err)
	}
	return m, nil
}
