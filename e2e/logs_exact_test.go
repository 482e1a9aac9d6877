package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/warmfleet/warmfleet/agent"
	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/internal/testenv"
	"github.com/warmfleet/warmfleet/nodelog"
	"github.com/warmfleet/warmfleet/schemas"
)

// exactScript writes, to stdout, binary bytes, invalid UTF-8 and numbered
// lines, then a 2 MiB line of random bytes (no newline among them) in
// eight pieces a second apart, then a last line without a newline; to
// stderr a line with invalid UTF-8 and one without a newline. It keeps a
// copy of each stream in /ctl, the bytes as the container wrote them.
const exactScript = `set -e
o=/ctl/stdout; e=/ctl/stderr; : > $o; : > $e
out() { cat /ctl/piece; cat /ctl/piece >> $o; }
err() { cat /ctl/piece >&2; cat /ctl/piece >> $e; }
{ printf '\000\001\002\377\376 binary\n'; printf '\303\050 not utf-8 \355\240\200\n'; seq 1 100; } > /ctl/piece; out
printf 'stderr \377\376\n' > /ctl/piece; err
i=0; while [ $i -lt 8 ]; do head -c 262144 /dev/urandom | tr '\n' x > /ctl/piece; out; sleep 1; i=$((i+1)); done
printf '\nlast line without newline' > /ctl/piece; out
printf 'stderr end without newline' > /ctl/piece; err
rm /ctl/piece`

// TestAcceptance_LogsByteExact: binary bytes, invalid UTF-8, a 2 MiB line
// and a last line without a newline come back from `warmfleet run logs`
// byte for byte, with the agent killed (SIGKILL) while the long line ships
// and started again; `run logs -o json` marks where the long line is split.
func TestAcceptance_LogsByteExact(t *testing.T) {
	w := newWorld(t)
	f := newFleet(t)
	bin := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet-agent")
	cli := testenv.BuildCommand(t, "github.com/warmfleet/warmfleet/cmd/warmfleet")
	dataDir := tempDir(t)
	first := f.startAgentProcess(bin, w, "node-x", dataDir, "agent-1")
	id := f.submit(schemas.RunRequest{RequestID: "logs-exact", Image: w.image.Reference,
		Caches: []schemas.CacheMount{{Name: "exact-ctl", Path: "/ctl"}}, Command: []string{"sh", "-c", exactScript}})
	f.waitPhase(id, schemas.PhaseRunning, 60*time.Second)
	stdoutKey := [2]string{schemas.WorkloadID(id, 1), bus.LogStdout}
	// Killed once some of the long line is stored, while the rest is
	// being written and shipped.
	f.eventually(60*time.Second, "part of the long line stored", func() bool {
		return len(f.stored(id).bytes[stdoutKey]) > 300<<10
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if n := len(f.stored(id).bytes[stdoutKey]); n >= 2<<20 {
		t.Fatalf("%d bytes already stored at the kill: it did not land while the long line shipped", n)
	}
	time.Sleep(2 * time.Second) // the Run writes on while no agent runs
	f.startAgentProcess(bin, w, "node-x", dataDir, "agent-2")
	f.waitPhase(id, schemas.PhaseSucceeded, 120*time.Second)

	ctl := filepath.Join(dataDir, "caches", "exact-ctl", "_")
	want := map[string][]byte{}
	for _, s := range []string{bus.LogStdout, bus.LogStderr} {
		b, err := os.ReadFile(filepath.Join(ctl, s))
		if err != nil {
			t.Fatal(err)
		}
		want[s] = b
	}
	if len(want[bus.LogStdout]) < 2<<20 || want[bus.LogStdout][len(want[bus.LogStdout])-1] == '\n' {
		t.Fatalf("the Run wrote %d bytes to stdout, ending %q: not the output the test is about", len(want[bus.LogStdout]), want[bus.LogStdout][max(0, len(want[bus.LogStdout])-10):])
	}
	if got := f.stored(id); got.duplicates != 0 || got.gaps != 0 {
		t.Fatalf("%d duplicate and %d gapped chunks stored across the kill", got.duplicates, got.gaps)
	}

	stdout, stderr := f.runLogs(cli, id)
	sameBytes(t, "run logs stdout", stdout.Bytes(), want[bus.LogStdout])
	sameBytes(t, "run logs stderr", stderr.Bytes(), want[bus.LogStderr])

	// -o json: the records, each "\n"-ended unless partial, are the bytes,
	// and the long line is more than one record.
	js := f.cli(cli)("run", "logs", id, "-o", "json")
	pipe, err := js.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Start(); err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	split := 0
	sc := bufio.NewScanner(pipe)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var rec struct {
			Stream  string `json:"stream"`
			Text    string `json:"text"`
			Data    []byte `json:"data"`
			Partial bool   `json:"partial"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("-o json line %.200q: %v", sc.Bytes(), err)
		}
		b := []byte(rec.Text)
		if rec.Data != nil {
			b = rec.Data
		}
		got[rec.Stream] = append(got[rec.Stream], b...)
		if rec.Partial {
			if rec.Stream == bus.LogStdout && len(got[rec.Stream]) < len(want[bus.LogStdout]) {
				split++
			}
		} else {
			got[rec.Stream] = append(got[rec.Stream], '\n')
		}
	}
	if err := js.Wait(); err != nil {
		t.Fatalf("run logs -o json: %v", err)
	}
	sameBytes(t, "-o json stdout", got[bus.LogStdout], want[bus.LogStdout])
	sameBytes(t, "-o json stderr", got[bus.LogStderr], want[bus.LogStderr])
	if split == 0 {
		t.Error("-o json marks no split in the 2 MiB line")
	}
}

// sameBytes compares output by length and sha256, showing where it first
// differs.
func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if sha256.Sum256(got) == sha256.Sum256(want) {
		return
	}
	i := 0
	for i < min(len(got), len(want)) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: %d bytes (sha256 %x), the Run wrote %d (sha256 %x); first difference at byte %d: %.40q vs %.40q",
		what, len(got), sha256.Sum256(got), len(want), sha256.Sum256(want), i, got[i:min(i+40, len(got))], want[i:min(i+40, len(want))])
}

// TestAcceptance_LogsSurviveRefusals: under auth, an agent's log login for
// a Run is refused ten times (the Run's record in wf_runs is unreadable, so
// the auth callout cannot check the login: the transient refusal), then
// admitted once the record reads again. The output waits on the node
// meanwhile, every byte ships, and only then is it deleted.
func TestAcceptance_LogsSurviveRefusals(t *testing.T) {
	sf := newSecureFleet(t)
	boot := sf.invite("node-a", 1, time.Minute)
	a := sf.startAgentWith("node-a", boot.EnrollmentToken, tempDir(t), nil)
	id := sf.submit(schemas.RunRequest{RequestID: "logs-refused", Image: testImage, Command: []string{"true"}})
	r := sf.waitPhase(id, schemas.PhaseSucceeded, 30*time.Second)
	if r.NodeID != "node-a" || r.AttemptID == "" {
		t.Fatalf("the Run ended on node %q, attempt %q", r.NodeID, r.AttemptID)
	}
	key := [2]string{r.AttemptID, bus.LogStdout}
	if n := len(sf.stored(id).bytes[key]); n != 0 {
		t.Fatalf("the no-op attempt stored %d bytes", n)
	}

	// With the agent stopped, its attempt's output is on its disk, as the
	// log writer leaves it: binary bytes, several chunks' worth, no final
	// newline.
	a.part.stop(t)
	content := append([]byte("\x00\xff binary\n"), bytes.Repeat([]byte("0123456789abcdef"), 20<<10)...)
	content = append(content, "\nno final newline"...)
	dir, err := agent.PrepareOutput(a.dataDir, r.TenantOf(), id, r.AttemptID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodelog.Write(nodelog.WriterSpec{Dir: dir}, [2]io.Reader{bytes.NewReader(content), strings.NewReader("")}, func() {}, time.Now); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	runs, err := sf.conn.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := runs.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs.Put(ctx, id, []byte("{not a run")); err != nil {
		t.Fatal(err)
	}

	sf.startAgentWith("node-a", boot.EnrollmentToken, a.dataDir, nil)
	refusals := func() int {
		n := 0
		for _, e := range sf.logs.FilterMessage("log login refused; output kept, retrying").All() {
			if fieldString(e.Context, "run_id") == id {
				n++
			}
		}
		return n
	}
	sf.eventually(120*time.Second, "ten refused log logins", func() bool { return refusals() >= 10 })
	if sf.logs.FilterMessage("auth callout: could not decide a login").FilterField(zapcoreString("user", bus.NodeLogUser("node-a", id))).Len() == 0 {
		t.Fatal("the refusals did not come from the auth callout failing to read the Run")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the output is gone after %d refusals: %v", refusals(), err)
	}
	if n := len(sf.stored(id).bytes[key]); n != 0 {
		t.Fatalf("%d bytes stored while every log login was refused", n)
	}

	if _, err := runs.Put(ctx, id, rec.Value()); err != nil {
		t.Fatal(err)
	}
	sf.eventually(90*time.Second, "the output shipped and its directory removed", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
	got := sf.stored(id)
	if got.duplicates != 0 || got.gaps != 0 {
		t.Fatalf("%d duplicate and %d gapped chunks", got.duplicates, got.gaps)
	}
	sameBytes(t, "stored stdout", got.bytes[key], content)
	if sf.logs.FilterMessage("log login admitted after refusals; shipping").Len() == 0 {
		t.Error("the agent did not log that its log login was admitted after the refusals")
	}
}

// fieldString is a string field of a log entry, "" when absent.
func fieldString(fs []zapcore.Field, key string) string {
	for _, f := range fs {
		if f.Key == key {
			return f.String
		}
	}
	return ""
}

func zapcoreString(key, value string) zapcore.Field {
	return zapcore.Field{Key: key, Type: zapcore.StringType, String: value}
}
