package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// child is a helper process (this binary, a hidden subcommand) that speaks
// JSON lines on stdout and takes one-line commands on stdin.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
	mu    sync.Mutex
	err   error
}

func startChild(name string, args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: exec.Command(self, args...), lines: make(chan map[string]any, 64)}
	c.cmd.Stderr = os.Stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				c.lines <- m
			}
		}
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// send writes one command line.
func (c *child) send(line string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// await returns the next line whose "event" is event, or fails after within.
// An "error" line from the child fails at once.
func (c *child) await(event string, within time.Duration) (map[string]any, error) {
	deadline := time.After(within)
	for {
		select {
		case m, ok := <-c.lines:
			if !ok {
				return nil, fmt.Errorf("%s exited while waiting for %q", c.name, event)
			}
			if m["event"] == "error" {
				return nil, fmt.Errorf("%s: %v", c.name, m["msg"])
			}
			if m["event"] == event {
				return m, nil
			}
		case <-deadline:
			return nil, fmt.Errorf("%s: no %q within %s", c.name, event, within)
		}
	}
}

// stop closes stdin (the child's cue to exit) and waits, killing it after
// within.
func (c *child) stop(within time.Duration) {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// emit writes one JSON line on stdout (children only).
var emitMu sync.Mutex

func emit(v map[string]any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	b, _ := json.Marshal(v)
	_, _ = os.Stdout.Write(append(b, '\n'))
}
