package vmfork

import (
	"context"
	"slices"

	"github.com/vmfork/vmfork/ledger"
)

// An explore's branches share their source's family ledger (ledger.go):
// each try's claims are listed in its result, and a losing branch's claims
// that are not done are released once the branch is removed (its effects
// never happened, so another machine of the family may do them); its done
// ones stay (they did). The winner's are kept, also when it is kept under
// another name: that machine continues from the winner's instant.

// TryClaim is a key a try's branch claimed in the family ledger, and its
// state when the explore returned: claimed, done, or released (by the
// branch itself, or by the explore when it removed the losing branch:
// then the key is in TryResult.Released too).
type TryClaim struct {
	Key    string `json:"key"`
	State  string `json:"state"`
	Result string `json:"result,omitempty"`
}

// recordClaims lists in each try the keys its branch holds or held in
// family. A ledger that cannot tell leaves the lists empty, with a warning.
func (mg *Manager) recordClaims(ctx context.Context, family string, tries []TryResult) {
	if mg.Ledger == nil || family == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	for i := range tries {
		t := &tries[i]
		recs, err := mg.Ledger.KeysOf(ctx, family, t.Branch)
		if err != nil {
			mg.Log.WithField("machine", t.Branch).WithError(err).Warn("could not list the branch's ledger claims")
			continue
		}
		for _, r := range recs {
			t.Claims = append(t.Claims, TryClaim{Key: r.Key, State: string(r.State), Result: r.Result})
		}
	}
}

// releaseLosers releases, for each removed branch that lost, the keys it
// holds and has not done, and says so in its try. winner is the winning
// try's branch ("" for none): never released.
func (mg *Manager) releaseLosers(ctx context.Context, family, winner string, removed []string, tries []TryResult) {
	if mg.Ledger == nil || family == "" {
		return
	}
	for i := range tries {
		t := &tries[i]
		if t.Branch == winner || !slices.Contains(removed, t.Branch) {
			continue
		}
		recs := mg.releaseHeldBy(ctx, family, t.Branch)
		for _, r := range recs {
			t.Released = append(t.Released, r.Key)
			found := false
			for j := range t.Claims {
				if t.Claims[j].Key == r.Key {
					t.Claims[j].State, found = string(ledger.Released), true
				}
			}
			if !found { // claimed after the listing
				t.Claims = append(t.Claims, TryClaim{Key: r.Key, State: string(ledger.Released)})
			}
		}
	}
}

// releaseHeldBy releases the undone claims of removed branch name; a
// failure is a warning (an operator can release them: vmfork ledger
// --release).
func (mg *Manager) releaseHeldBy(ctx context.Context, family, name string) []ledger.Record {
	if mg.Ledger == nil || family == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	recs, err := mg.Ledger.ReleaseHeldBy(ctx, family, name)
	if err != nil {
		mg.Log.WithField("machine", name).WithError(err).Warn("could not release the removed branch's ledger claims (vmfork ledger --release)")
		return nil
	}
	if len(recs) > 0 {
		mg.Log.WithField("machine", name).WithField("keys", len(recs)).Info("released the removed branch's claims that were not done")
	}
	return recs
}
