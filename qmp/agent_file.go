package qmp

import (
	"context"
	"errors"
	"fmt"
	"time"
)

const (
	// fileChunk is the most ReadFile and WriteFile move per command. qemu-ga allows 48 MB, but
	// every byte crosses virtio-serial as base64 in one JSON line, so smaller keeps calls short.
	fileChunk = 256 << 10
	// fileCloseTimeout bounds the guest-file-close that ReadFile and WriteFile send after ctx
	// has ended, so a cancelled copy still releases the guest's handle.
	fileCloseTimeout = 5 * time.Second
)

// errShortWrite is returned when the guest accepts no bytes of a non-empty write.
var errShortWrite = errors.New("guest accepted no bytes")

// FileOpen opens path in the guest with an fopen(3) mode such as "r" or "w" and returns a handle.
func (a *Agent) FileOpen(ctx context.Context, path, mode string) (int64, error) {
	args := struct {
		Path string `json:"path"`
		Mode string `json:"mode,omitempty"`
	}{path, mode}
	var h int64
	if err := a.Execute(ctx, AgentCmdFileOpen, args, &h); err != nil {
		return 0, err
	}
	return h, nil
}

// FileRead reads up to count bytes from handle. eof reports that the guest hit end of file.
func (a *Agent) FileRead(ctx context.Context, handle int64, count int) (data []byte, eof bool, err error) {
	args := struct {
		Handle int64 `json:"handle"`
		Count  int   `json:"count"`
	}{handle, count}
	var r struct {
		Count int    `json:"count"`
		Buf   []byte `json:"buf-b64"` // encoding/json decodes standard base64 into []byte
		EOF   bool   `json:"eof"`
	}
	if err := a.Execute(ctx, AgentCmdFileRead, args, &r); err != nil {
		return nil, false, err
	}
	return r.Buf, r.EOF, nil
}

// FileWrite writes data to handle and returns how many bytes the guest wrote.
func (a *Agent) FileWrite(ctx context.Context, handle int64, data []byte) (int, error) {
	args := struct {
		Handle int64  `json:"handle"`
		Buf    []byte `json:"buf-b64"` // encoded as standard base64, as the schema wants
	}{handle, data}
	var r struct {
		Count int `json:"count"`
	}
	if err := a.Execute(ctx, AgentCmdFileWrite, args, &r); err != nil {
		return 0, err
	}
	return r.Count, nil
}

// FileClose closes handle.
func (a *Agent) FileClose(ctx context.Context, handle int64) error {
	return a.Execute(ctx, AgentCmdFileClose, map[string]int64{"handle": handle}, nil)
}

// ReadFile returns the contents of the guest file path.
func (a *Agent) ReadFile(ctx context.Context, path string) (_ []byte, err error) {
	h, err := a.FileOpen(ctx, path, "r")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, a.closeFile(ctx, h)) }()
	var out []byte
	for {
		data, eof, err := a.FileRead(ctx, h, fileChunk)
		if err != nil {
			return nil, fmt.Errorf("qmp: read guest file %s: %w", path, err)
		}
		out = append(out, data...)
		if eof || len(data) == 0 {
			return out, nil
		}
	}
}

// WriteFile replaces the guest file path with data. The guest's umask decides a new file's mode.
func (a *Agent) WriteFile(ctx context.Context, path string, data []byte) (err error) {
	h, err := a.FileOpen(ctx, path, "w")
	if err != nil {
		return err
	}
	// The close error matters here: it is where the guest's stdio flushes.
	defer func() { err = errors.Join(err, a.closeFile(ctx, h)) }()
	for len(data) > 0 {
		chunk := data[:min(len(data), fileChunk)]
		n, err := a.FileWrite(ctx, h, chunk)
		if err != nil {
			return fmt.Errorf("qmp: write guest file %s: %w", path, err)
		}
		if n <= 0 {
			return fmt.Errorf("qmp: write guest file %s: %w", path, errShortWrite)
		}
		data = data[n:]
	}
	return nil
}

// closeFile closes h even when ctx has already ended, with a short bound of its own, so a
// cancelled copy does not leak the guest's handle.
func (a *Agent) closeFile(ctx context.Context, h int64) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fileCloseTimeout)
	defer cancel()
	return a.FileClose(cctx, h)
}
