package apicall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// MaxBodyBytes bounds a response body.
const MaxBodyBytes = 16 << 20

// Client sends one provider's API requests.
type Client struct {
	// Provider names the adapter in errors and logs.
	Provider string
	// Base is the API root, without a trailing slash.
	Base string
	Key  Key
	// Authorize puts the key on a request (a header of the provider's
	// choosing).
	Authorize func(r *http.Request, key string)
	// Stock are the provider's out-of-stock phrases (StockPhrases when nil).
	Stock []string
	HTTP  *http.Client
	Log   *zap.Logger
	Now   func() time.Time
}

// Bearer authorizes a request with the key as a bearer token.
func Bearer(r *http.Request, key string) { r.Header.Set("Authorization", "Bearer "+key) }

// NewClient checks base (http(s)://host[/path], no credentials) and returns
// a client whose HTTP client never follows a redirect off base's host.
func NewClient(provider, base string, key Key, authorize func(*http.Request, string), httpClient *http.Client, log *zap.Logger, now func() time.Time) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: provider, Op: "configure", Message: "base URL must be http(s)://host[/path] without credentials"}
	}
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 60 * time.Second}
	}
	if log == nil {
		log = zap.NewNop()
	}
	if now == nil {
		now = time.Now
	}
	return &Client{Provider: provider, Base: strings.TrimRight(u.String(), "/"), Key: key, Authorize: authorize, HTTP: GuardRedirects(httpClient), Log: log, Now: now}, nil
}

// Call sends one request and returns the body of a 2xx answer. Any other
// answer becomes StatusError's coded error; a transport failure stays
// uncoded (the request may have reached the provider). Neither carries the
// key.
func (c *Client) Call(ctx context.Context, op, ref, method, path string, in any) ([]byte, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, &capacity.Error{Code: capacity.CodeInvalid, Provider: c.Provider, Op: op, Ref: ref, Message: "request does not encode"}
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, body)
	if err != nil {
		return nil, c.TransportError(op, ref, err)
	}
	c.Authorize(req, c.Key.Reveal())
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.HTTP.Do(req)
	if err != nil {
		c.Log.Debug("provider request failed", zap.String("provider", c.Provider), zap.String("op", op), zap.String("method", method),
			zap.String("path", path), zap.Duration("took", time.Since(start)))
		return nil, c.TransportError(op, ref, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	c.Log.Debug("provider request", zap.String("provider", c.Provider), zap.String("op", op), zap.String("method", method), zap.String("path", path),
		zap.Int("status", resp.StatusCode), zap.Duration("took", time.Since(start)))
	if err != nil {
		return nil, c.TransportError(op, ref, err)
	}
	if len(data) > MaxBodyBytes {
		return nil, &capacity.Error{Provider: c.Provider, Op: op, Ref: ref, Message: "response larger than 16 MiB"}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, StatusError(c.Provider, c.Key, c.Stock, op, ref, resp.StatusCode, resp.Header, data, c.Now())
	}
	return data, nil
}

// TransportError keeps a network failure uncoded (its outcome is unknown)
// and scrubs the key from its text should any layer have echoed it.
func (c *Client) TransportError(op, ref string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s %s: %w", c.Provider, op, ref, err)
	}
	return &capacity.Error{Provider: c.Provider, Op: op, Ref: ref, Message: Sanitize(c.Key, err.Error())}
}

// DecodeError is a 2xx body that could not be read: the request was
// accepted, so the outcome is unknown and the error uncoded.
func (c *Client) DecodeError(op, ref string, err error) error {
	return &capacity.Error{Provider: c.Provider, Op: op, Ref: ref, Message: "unreadable response: " + Sanitize(c.Key, err.Error())}
}

// GuardRedirects returns a copy of c that refuses to follow a redirect to
// another host or from https to http. Go's client forwards custom headers
// such as an API key on redirects, so following one off-host would hand
// the key to whoever answers there.
func GuardRedirects(c *http.Client) *http.Client {
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
