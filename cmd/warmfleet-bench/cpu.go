package main

import (
	"bufio"
	"fmt"
	"os"
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

// procCPU follows the CPU of the processes whose command line holds every
// one of match, polling /proc, over a window: those already running count
// from the start, those started later from zero, and one that exits counts
// to its last poll.
type procCPU struct {
	match      []string
	mu         sync.Mutex
	base, last map[int]float64
	stop, done chan struct{}
	start, end time.Time
}

func watchProcs(every time.Duration, match ...string) *procCPU {
	p := &procCPU{match: match, base: map[int]float64{}, last: map[int]float64{}, stop: make(chan struct{}), done: make(chan struct{})}
	p.poll(true)
	p.start = time.Now()
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.poll(false)
			}
		}
	}()
	return p
}

func (p *procCPU) poll(first bool) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p.mu.Lock()
		_, known := p.last[pid]
		p.mu.Unlock()
		if !known {
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || !containsAll(string(b), p.match) {
				continue
			}
		}
		c, err := cpuSeconds(pid)
		if err != nil {
			continue // gone: it keeps its last value
		}
		p.mu.Lock()
		if !known && first {
			p.base[pid] = c
		}
		p.last[pid] = c
		p.mu.Unlock()
	}
}

// cores ends the window: the processes' CPU seconds per wall second.
func (p *procCPU) cores() float64 {
	p.poll(false)
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum float64
	for pid, c := range p.last {
		sum += c - p.base[pid]
	}
	return sum / time.Since(p.start).Seconds()
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// machineBusy is the CPU seconds all processes on the machine have used
// so far: the "cpu" line of /proc/stat less idle, iowait and steal.
func machineBusy() (float64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, fmt.Errorf("/proc/stat: empty")
	}
	fs := strings.Fields(sc.Text())
	if len(fs) < 6 || fs[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: %q", sc.Text())
	}
	var busy float64
	for i, v := range fs[1:] {
		if i >= 8 { // guest time is already in user
			break
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		if i == 3 || i == 4 || i == 7 { // idle, iowait, steal
			continue
		}
		busy += n
	}
	return busy / clockTicks, nil
}
