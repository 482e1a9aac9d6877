package shadeform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// maxBodyBytes bounds a response body; the instance-type catalogue is the
// largest answer and is far below this.
const maxBodyBytes = 16 << 20

// call sends one request and returns the body of a 2xx answer. Any other
// answer becomes apiError's coded error; a transport failure stays uncoded
// (the request may have reached Shadeform). Neither carries the key.
func (p *Provider) call(ctx context.Context, op, ref, method, path string, in any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: Type, Op: op, Ref: ref, Message: "request does not encode"}
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, body)
	if err != nil {
		return nil, p.transportError(op, ref, err)
	}
	req.Header.Set("X-API-KEY", p.key.reveal())
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := p.http.Do(req)
	if err != nil {
		p.log.Debug("shadeform request failed", zap.String("op", op), zap.String("method", method), zap.String("path", path),
			zap.Duration("took", time.Since(start)))
		return nil, p.transportError(op, ref, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBodyBytes+1))
	p.log.Debug("shadeform request", zap.String("op", op), zap.String("method", method), zap.String("path", path),
		zap.Int("status", resp.StatusCode), zap.Duration("took", time.Since(start)))
	if err != nil {
		return nil, p.transportError(op, ref, err)
	}
	if len(data) > maxBodyBytes {
		return nil, &capacity.Error{Provider: Type, Op: op, Ref: ref, Message: "response larger than 16 MiB"}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, apiError(p.key, op, ref, resp.StatusCode, resp.Header, data, p.now())
	}
	return data, nil
}

// transportError keeps a network failure uncoded (its outcome is unknown)
// and scrubs the key from its text should any layer have echoed it.
func (p *Provider) transportError(op, ref string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shadeform %s %s: %w", op, ref, err)
	}
	return &capacity.Error{Provider: Type, Op: op, Ref: ref, Message: sanitize(p.key, err.Error())}
}

// decodeError is a 2xx body we could not read: the request was accepted,
// so the outcome is unknown and the error uncoded.
func (p *Provider) decodeError(op, ref string, err error) error {
	return &capacity.Error{Provider: Type, Op: op, Ref: ref, Message: "unreadable response: " + sanitize(p.key, err.Error())}
}

// guardRedirects returns a copy of c that refuses to follow a redirect to
// another host or from https to http. Go's client forwards custom headers
// such as X-API-KEY on redirects, so following one off-host would hand the
// key to whoever answers there.
func guardRedirects(c *http.Client) *http.Client {
	guarded := *c
	next := c.CheckRedirect
	guarded.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		if !strings.EqualFold(req.URL.Host, first.Host) || (first.Scheme == "https" && req.URL.Scheme != "https") {
			return fmt.Errorf("refusing redirect to %s://%s: the API key is only sent to %s", req.URL.Scheme, req.URL.Host, first.Host)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 5 {
			return errors.New("stopped after 5 redirects")
		}
		return nil
	}
	return &guarded
}
