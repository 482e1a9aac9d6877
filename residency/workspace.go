package residency

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Workspaces materialises a session's local working directory. It never
// holds durable state: releasing a workspace deletes only the local copy.
type Workspaces interface {
	// EnsureWorkspace makes the workspace available and returns its root.
	EnsureWorkspace(ctx context.Context, key Key) (string, error)
	// ReleaseWorkspace drops the local materialisation. Releasing one that
	// does not exist is not an error.
	ReleaseWorkspace(ctx context.Context, key Key) error
}

// DirWorkspaces keeps each workspace in <root>/<tenant>/<session>.
type DirWorkspaces struct {
	root string
}

var _ Workspaces = (*DirWorkspaces)(nil)

// NewDirWorkspaces uses root (created 0700 if missing), which must be
// absolute: the path is bind-mounted into containers.
func NewDirWorkspaces(root string) (*DirWorkspaces, error) {
	if !filepath.IsAbs(root) {
		return nil, &InvalidOptionsError{Field: "root", Reason: fmt.Sprintf("%q is not absolute", root)}
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("residency: workspace root: %w", err)
	}
	return &DirWorkspaces{root: filepath.Clean(root)}, nil
}

// Path is where key's workspace lives. Key.Validate keeps it under root.
func (w *DirWorkspaces) Path(key Key) string {
	return filepath.Join(w.root, key.Tenant, key.Session)
}

// EnsureWorkspace implements Workspaces.
func (w *DirWorkspaces) EnsureWorkspace(ctx context.Context, key Key) (string, error) {
	if err := key.Validate(); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p := w.Path(key)
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", fmt.Errorf("residency: workspace %s: %w", key, err)
	}
	return p, nil
}

// ReleaseWorkspace implements Workspaces.
func (w *DirWorkspaces) ReleaseWorkspace(ctx context.Context, key Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p := w.Path(key)
	if err := os.RemoveAll(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("residency: release workspace %s: %w", key, err)
	}
	// The tenant directory goes when its last session does.
	_ = os.Remove(filepath.Dir(p))
	return nil
}
