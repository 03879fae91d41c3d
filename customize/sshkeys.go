package customize

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// SSH host keys are made on the host, with Go's crypto, and written into the
// guest through the agent: ssh-keygen -A in a TCG guest spends seconds on an
// RSA key (3.4-9.6 s observed on Debian 12), and a fresh fork child has the
// least entropy of its life.

// sshDir is where sshd's host keys live.
const sshDir = "/etc/ssh"

// KeyType is a kind of SSH host key: "ed25519", "ecdsa" with the curve's
// size in Bits (256, 384, 521), or "rsa" with its modulus size.
type KeyType struct {
	Alg  string `json:"alg"`
	Bits int    `json:"bits,omitempty"`
}

func (t KeyType) String() string {
	if t.Alg == "ed25519" {
		return t.Alg
	}
	return fmt.Sprintf("%s-%d", t.Alg, t.Bits)
}

// file is the host key's file name in /etc/ssh, as ssh-keygen -A names it.
func (t KeyType) file() string { return sshDir + "/ssh_host_" + t.Alg + "_key" }

// keyAlgs are the host key kinds OpenSSH makes, in its order.
var keyAlgs = []string{"rsa", "ecdsa", "ed25519"}

// ParseKeyType returns the kind of an OpenSSH public key line.
func ParseKeyType(pub []byte) (KeyType, error) {
	k, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		return KeyType{}, err
	}
	ck, ok := k.(ssh.CryptoPublicKey)
	if !ok {
		return KeyType{}, fmt.Errorf("key type %s is not supported", k.Type())
	}
	switch p := ck.CryptoPublicKey().(type) {
	case ed25519.PublicKey:
		return KeyType{Alg: "ed25519"}, nil
	case *ecdsa.PublicKey:
		return KeyType{Alg: "ecdsa", Bits: p.Curve.Params().BitSize}, nil
	case *rsa.PublicKey:
		return KeyType{Alg: "rsa", Bits: p.N.BitLen()}, nil
	}
	return KeyType{}, fmt.Errorf("key type %s is not supported", k.Type())
}

// HostKeyTypes returns the kinds of SSH host key the guest has, read from
// its /etc/ssh/ssh_host_*_key.pub through the agent's file calls (no guest
// process). A guest without sshd has none.
func HostKeyTypes(ctx context.Context, a Agent) ([]KeyType, error) {
	var types []KeyType
	for _, alg := range keyAlgs {
		b, err := a.ReadFile(ctx, sshDir+"/ssh_host_"+alg+"_key.pub")
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			continue // no such key
		}
		t, err := ParseKeyType(b)
		if err != nil || t.Alg != alg {
			return nil, fmt.Errorf("%s/ssh_host_%s_key.pub: not an %s key", sshDir, alg, alg)
		}
		types = append(types, t)
	}
	return types, nil
}

func generateKey(t KeyType) (crypto.Signer, error) {
	switch t.Alg {
	case "ed25519":
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	case "ecdsa":
		var c elliptic.Curve
		switch t.Bits {
		case 256:
			c = elliptic.P256()
		case 384:
			c = elliptic.P384()
		case 521:
			c = elliptic.P521()
		default:
			return nil, fmt.Errorf("ecdsa host key of %d bits: want 256, 384 or 521", t.Bits)
		}
		return ecdsa.GenerateKey(c, rand.Reader)
	case "rsa":
		if t.Bits < 2048 {
			// What ssh-keygen -A would make instead of a weak key.
			t.Bits = 3072
		}
		return rsa.GenerateKey(rand.Reader, t.Bits)
	}
	return nil, fmt.Errorf("host key type %q is not supported", t.Alg)
}

// HostKey is a host key in OpenSSH's file formats.
type HostKey struct {
	Type    KeyType
	Private []byte // the key file, "-----BEGIN OPENSSH PRIVATE KEY-----"
	Public  []byte // the .pub file: one authorized_keys line
}

// encodeKey writes k as ssh-keygen does, with comment (root@HOST).
func encodeKey(t KeyType, k crypto.Signer, comment string) (HostKey, error) {
	blk, err := ssh.MarshalPrivateKey(k, comment)
	if err != nil {
		return HostKey{}, fmt.Errorf("encode %s host key: %w", t, err)
	}
	pub, err := ssh.NewPublicKey(k.Public())
	if err != nil {
		return HostKey{}, fmt.Errorf("encode %s host key: %w", t, err)
	}
	line := bytes.TrimSuffix(ssh.MarshalAuthorizedKey(pub), []byte("\n"))
	line = append(append(line, ' '), comment...)
	return HostKey{Type: t, Private: pem.EncodeToMemory(blk), Public: append(line, '\n')}, nil
}

// KeyMaker makes SSH host keys, some before they are asked for: a fork
// knows its source's key types before its children start, and an RSA key
// takes a few hundred milliseconds of host CPU, which a child need not wait
// for. Its methods are safe for concurrent use; the zero KeyMaker works.
type KeyMaker struct {
	mu    sync.Mutex
	ready map[KeyType][]chan keyResult
}

type keyResult struct {
	key crypto.Signer
	err error
}

// Prefetch starts making n keys of each of types in the background.
func (m *KeyMaker) Prefetch(types []KeyType, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ready == nil {
		m.ready = map[KeyType][]chan keyResult{}
	}
	for _, t := range types {
		for range n {
			ch := make(chan keyResult, 1)
			go func() {
				k, err := generateKey(t)
				ch <- keyResult{k, err}
			}()
			m.ready[t] = append(m.ready[t], ch)
		}
	}
}

// Take returns a key of type t: one that Prefetch started, or a new one.
// A key is never given out twice.
func (m *KeyMaker) Take(ctx context.Context, t KeyType) (crypto.Signer, error) {
	var ch chan keyResult
	if m != nil {
		m.mu.Lock()
		if q := m.ready[t]; len(q) > 0 {
			ch, m.ready[t] = q[0], q[1:]
		}
		m.mu.Unlock()
	}
	if ch == nil {
		return generateKey(t)
	}
	select {
	case r := <-ch:
		return r.key, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// SSHHostKeysStep replaces the guest's SSH host keys with new ones of the
// same kinds, made on the host, and has a running sshd load them. Guests
// without host keys (no sshd) are skipped.
func SSHHostKeysStep() Step {
	return Step{Name: StepSSHHostKeys, Timeout: sshTimeout, Parts: partsSSH}
}

// keyMark frames the files in the SSH part's input (scripts/ssh-keys.sh);
// it cannot occur in a key file.
const keyMark = "%vmfork%"

func partsSSH(ctx context.Context, env *Env) ([]*Part, error) {
	var types []KeyType
	if env.Facts != nil && env.Facts.SSH != nil {
		types = env.Facts.SSH.Types
	} else {
		var err error
		if types, err = HostKeyTypes(ctx, env.Agent); err != nil {
			return nil, fmt.Errorf("read the guest's host keys: %w", err)
		}
	}
	if len(types) == 0 {
		return nil, Skipped("the guest has no SSH host keys (" + sshDir + "/ssh_host_*_key.pub)")
	}
	host := env.hostname
	if host == "" {
		host = env.Child.Name
	}
	var in bytes.Buffer
	var names []string
	for _, t := range types {
		k, err := env.HostKeys.Take(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("make a %s host key: %w", t, err)
		}
		hk, err := encodeKey(t, k, "root@"+host)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&in, "%s F %s\n%s%s E\n", keyMark, t.file(), hk.Private, keyMark)
		fmt.Fprintf(&in, "%s F %s.pub\n%s%s E\n", keyMark, t.file(), hk.Public, keyMark)
		names = append(names, t.String())
	}
	return []*Part{{Script: sshScript, Input: in.Bytes(), Done: func(env *Env, out string) error {
		env.Detailf("new %s host keys; %s", strings.Join(names, ", "), strings.TrimSpace(out))
		return nil
	}}}, nil
}
