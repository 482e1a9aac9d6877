package artifactstore

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// urlSource fetches an artifact over HTTP(S), resuming with a Range
// request.
type urlSource struct {
	client  *http.Client
	url     string
	headers map[string]string
	// where names the URL in errors without its query (a presigned query
	// is a credential) or userinfo.
	where string
}

// NewURLSource serves the bytes at rawURL, sending headers (the fetch's
// credential, if any) with every request to rawURL's origin. Redirects are
// followed under keepCredentials: never from https to plain http, and
// without the headers to another origin. Errors never carry the headers
// or the URL's query. A nil client is http.DefaultClient; its own
// CheckRedirect, if any, is asked first.
func NewURLSource(client *http.Client, rawURL string, headers map[string]string) Source {
	if client == nil {
		client = http.DefaultClient
	}
	where := "artifact URL"
	if u, err := url.Parse(rawURL); err == nil {
		where = u.Scheme + "://" + u.Host + u.EscapedPath()
	}
	guarded := *client
	guarded.CheckRedirect = keepCredentials(client.CheckRedirect, headers)
	return &urlSource{client: &guarded, url: rawURL, headers: headers, where: where}
}

func (s *urlSource) Open(ctx context.Context, offset int64) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, &permanent{fmt.Errorf("%s: bad request", s.where)}
	}
	for k, v := range s.headers {
		req.Header.Set(k, v)
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// *url.Error repeats the full URL; keep only what went wrong.
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("GET %s: %w", s.where, err)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusOK && offset == 0:
		return resp.Body, nil
	case code == http.StatusPartialContent && offset > 0 && rangeStart(resp.Header.Get("Content-Range")) == offset:
		return resp.Body, nil
	case code == http.StatusOK, code == http.StatusPartialContent, code == http.StatusRequestedRangeNotSatisfiable:
		// The server ignored the range or answered another one: start
		// over with a plain GET rather than trust a splice.
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s from byte %d: status %d: %w", s.where, offset, code, ErrNoResume)
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: status %d: %w", s.where, code, ErrSourceAuth)
	case code == http.StatusNotFound || code == http.StatusGone:
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: status %d: %w", s.where, code, ErrNotFound)
	case code >= 400 && code < 500 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests:
		resp.Body.Close()
		return nil, &permanent{fmt.Errorf("GET %s: status %d", s.where, code)}
	default:
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: status %d", s.where, code)
	}
}

// rangeStart parses the first byte of "bytes <first>-<last>/<total>"; -1
// when it cannot.
func rangeStart(cr string) int64 {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return -1
	}
	first, _, ok := strings.Cut(rest, "-")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(first, 10, 64)
	if err != nil {
		return -1
	}
	return n
}
