package checkpoint

import (
	"errors"
	"fmt"
)

// Code names why a checkpoint was refused, for an operator and for the
// session's events.
type Code string

const (
	// CodeInvalid: the manifest is malformed (a path outside the workspace,
	// a duplicate, an entry under something not a directory, a bad digest).
	CodeInvalid Code = "checkpoint_invalid"
	// CodeCorrupt: a chunk's bytes do not match its digest or its size.
	CodeCorrupt Code = "checkpoint_corrupt"
	// CodeIncomplete: a chunk or the manifest the checkpoint names is not
	// in the store.
	CodeIncomplete Code = "checkpoint_incomplete"
)

// Errors matched with errors.Is; an *Error of a code matches its sentinel.
var (
	ErrInvalid    = errors.New("checkpoint: invalid manifest")
	ErrCorrupt    = errors.New("checkpoint: chunk does not match its digest")
	ErrIncomplete = errors.New("checkpoint: content missing from the store")
)

// Error is a refused checkpoint: its code, the workspace path or manifest
// field concerned, and what was wrong.
type Error struct {
	Code   Code
	Path   string
	Detail string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("checkpoint: %s: %s", e.Code, e.Detail)
	}
	return fmt.Sprintf("checkpoint: %s: %s: %s", e.Code, e.Path, e.Detail)
}

// Is matches the sentinel of e's code.
func (e *Error) Is(target error) bool {
	switch e.Code {
	case CodeInvalid:
		return target == ErrInvalid
	case CodeCorrupt:
		return target == ErrCorrupt
	case CodeIncomplete:
		return target == ErrIncomplete
	}
	return false
}

func refuse(code Code, path, format string, args ...any) *Error {
	return &Error{Code: code, Path: path, Detail: fmt.Sprintf(format, args...)}
}
