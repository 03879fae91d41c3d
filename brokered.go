package vmfork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmfork/vmfork/broker"
	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/customize"
)

// Brokered secrets (contract's secrets:, package broker): a machine whose
// contract has secrets gets placeholders, never the values. Before its
// QEMU starts, the Manager resolves its values on the host (an exec hook
// gets the machine's name, parent and index), draws its placeholders, and
// registers it with the host's broker, which opens the machine's own
// proxy listener where the driver says (BrokerEndpoint) and keeps the
// values in its memory only. The identity chain then writes the
// placeholders, the proxy settings and vmfork's CA into the guest. The
// record keeps the placeholders and the proxy's address, never a value.

// SecretBroker is where machines with brokered secrets are registered
// (package broker's Client; the CLI wires one in, as it does the reaper).
type SecretBroker interface {
	// Register registers c, or updates it; it starts a broker when none
	// runs. It returns the address c's proxy listens on.
	Register(ctx context.Context, c broker.Child) (broker.Addr, error)
	// Unregister drops machine name: its proxy stops listening.
	// Idempotent.
	Unregister(ctx context.Context, name string) error
}

// BrokerEndpoint is the optional driver capability to serve brokered
// secrets: where a machine's proxy listens on the host, so that only that
// machine reaches it, and how its guest reaches it.
type BrokerEndpoint interface {
	// BrokerListen returns the address the broker listens on for machine
	// m (a host address on its network, port 0 for any), and whether only
	// m's own QEMU process may connect there (broker.Child.FromPID: a
	// machine on QEMU's user network reaches the host's loopback through
	// its QEMU). It changes nothing.
	BrokerListen(m *Machine) (addr broker.Addr, fromQEMU bool, err error)
	// ProxyURL is the proxy as m's guest reaches it once the broker
	// listens on addr (http://HOST:PORT).
	ProxyURL(m *Machine, addr broker.Addr) (string, error)
}

// BrokerState is how a machine's secrets are brokered: what its guest
// holds and where its proxy is. No value is ever in it.
type BrokerState struct {
	// Placeholders are the guest's stand-ins, by secret name.
	Placeholders map[string]string `json:"placeholders"`
	// Listen is where the broker listens for this machine.
	Listen broker.Addr `json:"listen"`
	// ProxyURL is the proxy as the guest reaches it.
	ProxyURL string `json:"proxy_url"`
}

// checkSecrets refuses, for a plan, secrets this host cannot broker for a
// machine like m: no broker wired in, a driver that cannot serve them, an
// env or file value that is not there (an exec value is only known when
// it runs, for each machine).
func (mg *Manager) checkSecrets(m *Machine, c *contract.Contract) error {
	if c == nil || len(c.Secrets) == 0 {
		return nil
	}
	if mg.Broker == nil {
		return fmt.Errorf("secrets: no broker is wired into this vmfork: %w", ErrUnsupported)
	}
	if _, ok := mg.Driver.(BrokerEndpoint); !ok {
		return fmt.Errorf("secrets: driver %q cannot broker secrets: %w", mg.Driver.Name(), ErrUnsupported)
	}
	for _, name := range c.SecretNames() {
		from := c.Secrets[name].ValueFrom
		switch {
		case from.Env != "":
			if _, ok := os.LookupEnv(from.Env); !ok {
				return fmt.Errorf("secrets.%s.value_from.env: %s is not set in vmfork's environment: %w", name, from.Env, ErrInvalid)
			}
		case from.File != "":
			if _, err := os.Stat(from.File); err != nil {
				return fmt.Errorf("secrets.%s.value_from.file: %w", name, asInvalid(err))
			}
		}
	}
	if _, _, err := mg.Driver.(BrokerEndpoint).BrokerListen(m); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	return nil
}

// brokerSecrets registers machine m, the index-th child of its fork (0
// for a boot), with the broker before its QEMU starts, and records its
// placeholders and proxy in m.Broker (the caller saves the record).
// started, called once m's QEMU runs, tells the broker its PID, so that
// the broker drops m by itself should its process die unannounced.
func (mg *Manager) brokerSecrets(ctx context.Context, m *Machine, index int) (started func(context.Context), err error) {
	started = func(context.Context) {}
	c := m.Contract
	if c == nil || len(c.Secrets) == 0 {
		return started, nil
	}
	if mg.Broker == nil {
		return started, fmt.Errorf("secrets: no broker: %w", ErrUnsupported)
	}
	ep, ok := mg.Driver.(BrokerEndpoint)
	if !ok {
		return started, fmt.Errorf("secrets: driver %q cannot broker secrets: %w", mg.Driver.Name(), ErrUnsupported)
	}
	names := c.SecretNames()
	placeholders, err := broker.Placeholders(names)
	if err != nil {
		return started, err
	}
	child := broker.ChildInfo{Name: m.Name, Parent: m.Parent, Index: index}
	reg := broker.Child{ChildInfo: child, PID: m.PID}
	if n := c.Network; n != nil {
		e := n.Egress
		reg.Egress = &e
	}
	for _, name := range names {
		s := c.Secrets[name]
		v, err := broker.Resolve(ctx, name, s, child, os.Getenv)
		if err != nil {
			return started, fmt.Errorf("secrets: %w", err)
		}
		reg.Secrets = append(reg.Secrets, broker.Binding{Name: name, Secret: s, Placeholder: placeholders[name], Value: v})
	}
	if reg.Listen, reg.FromPID, err = ep.BrokerListen(m); err != nil {
		return started, fmt.Errorf("secrets: %w", err)
	}
	addr, err := mg.Broker.Register(ctx, reg)
	if err != nil {
		return started, fmt.Errorf("secrets: register with the broker: %w", err)
	}
	defer func() {
		if err != nil {
			mg.unbroker(context.WithoutCancel(ctx), m)
		}
	}()
	url, err := ep.ProxyURL(m, addr)
	if err != nil {
		return started, fmt.Errorf("secrets: %w", err)
	}
	m.Broker = &BrokerState{Placeholders: placeholders, Listen: addr, ProxyURL: url}
	return func(ctx context.Context) {
		reg.PID, reg.Listen = m.PID, addr
		if _, err := mg.Broker.Register(ctx, reg); err != nil {
			mg.Log.WithField("machine", m.Name).WithError(err).Warn("could not tell the secrets broker the machine's process")
		}
	}, nil
}

// unbroker drops machine m from the broker, if it has secrets; a failure
// is logged (the broker drops a machine whose process is gone by itself).
func (mg *Manager) unbroker(ctx context.Context, m *Machine) {
	if m.Broker == nil || mg.Broker == nil {
		return
	}
	if err := mg.Broker.Unregister(ctx, m.Name); err != nil {
		mg.Log.WithField("machine", m.Name).WithError(err).Warn("could not unregister the machine from the secrets broker")
	}
}

// contractSteps adds the guest's part of c's contract to its identity
// chain: the inherited connections closed before its NIC comes up (a live
// child only: one that boots has none), then its secret files wiped and
// rotated (secretfiles.go), and its brokered secrets' files and CA before
// its hooks run.
func (mg *Manager) contractSteps(chain customize.Chain, c *Machine, live bool) (customize.Chain, error) {
	if live && c.Contract.NetworkOf().Connections == contract.ConnReset {
		chain = chain.InsertBefore(customize.StepNetwork, customize.ConnectionsStep())
	}
	chain = secretFileSteps(chain, c)
	if c.Broker != nil {
		files, err := mg.guestSecretFiles(c)
		if err != nil {
			return chain, err
		}
		var stores []customize.TrustStore
		for _, ts := range broker.TrustStores() {
			stores = append(stores, customize.TrustStore{ID: ts.ID, File: ts.File, Bundle: ts.Bundle, Update: ts.Update})
		}
		chain = chain.InsertBefore(customize.StepHooks, customize.SecretsStep(files, broker.GuestCAFile, stores))
	}
	return chain, nil
}

// guestSecretFiles are the files machine m's identity chain writes into
// its guest: placeholders, proxy settings and vmfork's CA (package broker,
// GuestFiles). NoProxy lists nothing beyond the broker's defaults.
func (mg *Manager) guestSecretFiles(m *Machine) (map[string][]byte, error) {
	if m.Broker == nil {
		return nil, nil
	}
	ca, err := broker.LoadOrCreateCA(filepath.Join(mg.Store.StateDir, dirBroker))
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	files, err := broker.GuestFiles(broker.Guest{Placeholders: m.Broker.Placeholders, ProxyURL: m.Broker.ProxyURL, CAPEM: ca.PEM()})
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	return files, nil
}
