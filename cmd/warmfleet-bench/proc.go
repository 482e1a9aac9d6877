package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuSeconds is a process's user+system CPU time so far.
func cpuSeconds(pid int) (float64, error) {
	if pid == os.Getpid() {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0, err
		}
		return tv(ru.Utime) + tv(ru.Stime), nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return (ut + st) / clockTicks, nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// rssBytes is a process's resident set size.
func rssBytes(pid int) int64 {
	v := procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
	kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	return kb * 1024
}

// cpuMeter measures the CPU a process uses over a window, in cores.
type cpuMeter struct {
	pid   int
	cpu0  float64
	wall0 time.Time
}

func startMeter(pid int) (*cpuMeter, error) {
	c, err := cpuSeconds(pid)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{pid: pid, cpu0: c, wall0: time.Now()}, nil
}

// cores is CPU seconds used per wall second since the meter started.
func (m *cpuMeter) cores() (float64, error) {
	c, err := cpuSeconds(m.pid)
	if err != nil {
		return 0, err
	}
	return (c - m.cpu0) / time.Since(m.wall0).Seconds(), nil
}

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
