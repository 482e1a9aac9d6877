// Package runlog owns reading Run and session output back from WF_LOGS:
// decoding the chunks node agents store there (bus/logs.go is the wire
// format), putting each (attempt, stream)'s bytes back together once each
// and in order, and reading a subject's lines, stored or live.
package runlog
