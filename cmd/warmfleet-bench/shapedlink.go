package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// linkChunk is the unit the link paces: one read, one wait, one write.
const linkChunk = 32 << 10

// shapedLink is a node's network link as the bench models it: TCP proxies
// on loopback (one per source the node reaches: the registry, NATS) whose
// bytes towards the node draw on one token bucket, so an image pull and an
// artifact fetch share the link as they do on a rented machine. Bytes from
// the node (requests, acks) are not paced: they are few.
type shapedLink struct {
	lim *rate.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	lns   []net.Listener
	conns map[net.Conn]struct{}
}

// newShapedLink is a link of mbit Mbit/s (10^6 bits). Its bucket holds
// 10 ms of traffic (at least one chunk): enough that pacing is not at the
// mercy of the timer's granularity, little enough to keep the rate flat.
func newShapedLink(mbit int) (*shapedLink, error) {
	if mbit <= 0 {
		return nil, fmt.Errorf("link of %d Mbit/s: must be positive", mbit)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &shapedLink{lim: rate.NewLimiter(0, linkChunk), ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	l.setRate(mbit)
	return l, nil
}

// setRate changes the link's speed; connections through it keep going.
func (l *shapedLink) setRate(mbit int) {
	bps := float64(mbit) * 1e6 / 8
	l.lim.SetBurst(max(linkChunk, int(bps/100)))
	l.lim.SetLimit(rate.Limit(bps))
}

// bytesPerSecond is the link's configured rate.
func (l *shapedLink) bytesPerSecond() float64 { return float64(l.lim.Limit()) }

// proxy listens on a free loopback port and forwards each connection to
// target, the bytes back through the link. It returns the address to dial.
func (l *shapedLink) proxy(target string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("shaped link: %w", err)
	}
	l.mu.Lock()
	l.lns = append(l.lns, ln)
	l.mu.Unlock()
	l.wg.Go(func() { l.accept(ln, target) })
	return ln.Addr().String(), nil
}

func (l *shapedLink) accept(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed
		}
		var d net.Dialer
		up, err := d.DialContext(l.ctx, "tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !l.track(c, up) {
			return
		}
		l.wg.Go(func() {
			defer l.untrack(c, up)
			done := make(chan struct{})
			go func() { // ends when the node stops sending or its conn closes
				defer close(done)
				_, _ = io.Copy(up, c)
				closeWrite(up)
			}()
			_ = l.pace(c, up)
			// The source is done with this connection: so is the node.
			_ = c.Close()
			_ = up.Close()
			<-done
		})
	}
}

// pace copies src to dst a chunk at a time, each after its tokens.
func (l *shapedLink) pace(dst io.Writer, src io.Reader) error {
	buf := make([]byte, linkChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := l.lim.WaitN(l.ctx, n); werr != nil {
				return werr
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// track registers a connection pair so close can end it; false once the
// link is closed.
func (l *shapedLink) track(cs ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		l.conns[c] = struct{}{}
	}
	return true
}

func (l *shapedLink) untrack(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(l.conns, c)
	}
}

// close stops every proxy and connection and waits for their goroutines.
func (l *shapedLink) close() {
	l.mu.Lock()
	l.cancel()
	for _, ln := range l.lns {
		_ = ln.Close()
	}
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// parseLinks reads --link: Mbit/s figures, comma-separated.
func parseLinks(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 100_000 {
			return nil, fmt.Errorf("--link %q: want Mbit/s figures between 1 and 100000, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// measure times n bytes through the link: the achieved rate's check.
func measureLink(ctx context.Context, l *shapedLink, n int64) (time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_, err = io.CopyN(c, zeroReader{}, n)
		served <- err
	}()
	addr, err := l.proxy(ln.Addr().String())
	if err != nil {
		return 0, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	got, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if serr := <-served; serr != nil {
		return 0, serr
	}
	if got != n {
		return 0, fmt.Errorf("link check: %d bytes of %d arrived", got, n)
	}
	return took, nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
