package capacity

import (
	"math"
	"testing"
)

const mi = 1 << 20

func TestAvailable(t *testing.T) {
	for _, tc := range []struct {
		name        string
		free        int64
		ratio       float64
		images      []Image
		thick, thin int64
	}{
		{name: "empty", free: 300 * mi, ratio: 1, thick: 300 * mi, thin: 300 * mi},
		{name: "a fully allocated thick image is in the free space already",
			free: 172 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 128 * mi}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "an old sparse image is owed its holes",
			free: 290 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 10 * mi}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "a thin image at ratio 1 holds its whole promise",
			free: 290 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Thin: true}},
			thick: 172 * mi, thin: 172 * mi},
		{name: "a thin image at ratio 2 holds half its promise",
			free: 290 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Thin: true}},
			thick: 236 * mi, thin: 2*300*mi - 128*mi},
		{name: "a thin image written beyond its backing at ratio 2",
			free: 200 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 100 * mi, Thin: true}},
			thick: 200 * mi, thin: 2*300*mi - 128*mi},
		{name: "thin overcommitted past the ratio (the ratio was lowered) promises nothing",
			free: 100 * mi, ratio: 1, images: []Image{{Size: 500 * mi, Allocated: 50 * mi, Thin: true}},
			thick: 0, thin: 0},
		{name: "thick owes more than is free",
			free: 10 * mi, ratio: 3, images: []Image{{Size: 100 * mi, Thin: false}},
			thick: 0, thin: 0},
		{name: "a thick image owes the blocks it shares with a snapshot, which a write copies",
			free: 172 * mi, ratio: 1, images: []Image{{Size: 128 * mi, Allocated: 128 * mi, Shared: 100 * mi}},
			thick: 72 * mi, thin: 72 * mi},
		{name: "a thin image owes nothing for what it shares",
			free: 290 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 10 * mi, Shared: 10 * mi, Thin: true}},
			thick: 236 * mi, thin: 2*300*mi - 128*mi},
		{name: "a snapshot being taken is promised what it may copy, thick or thin",
			free: 200 * mi, ratio: 2, images: []Image{{Size: 128 * mi, Allocated: 128 * mi, Copying: 128 * mi}, {Size: 64 * mi, Allocated: 20 * mi, Thin: true, Copying: 20 * mi}},
			thick: 200*mi - 148*mi - 12*mi, thin: 2*(20*mi+200*mi-148*mi) - 64*mi},
		{name: "allocation past the size (metadata) owes nothing",
			free: 50 * mi, ratio: 1, images: []Image{{Size: 10 * mi, Allocated: 11 * mi}, {Size: 10 * mi, Allocated: 11 * mi, Thin: true}},
			thick: 50 * mi, thin: 50 * mi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New(tc.free, tc.ratio, tc.images)
			if got := a.Available(false); got != tc.thick {
				t.Errorf("thick available %d MiB, want %d MiB", got/mi, tc.thick/mi)
			}
			if got := a.Available(true); got != tc.thin {
				t.Errorf("thin available %d MiB, want %d MiB", got/mi, tc.thin/mi)
			}
		})
	}
}

// TestRatioOneNeverOverpromises checks that at ratio 1 thick and thin answer
// alike, and that whatever is promised fits: for every mix of images, the
// promises not yet backed plus a new volume of the available size never
// exceed the free space.
func TestRatioOneNeverOverpromises(t *testing.T) {
	for free := int64(0); free <= 64*mi; free += 8 * mi {
		for thickAlloc := int64(0); thickAlloc <= 16*mi; thickAlloc += 4 * mi {
			for thinAlloc := int64(0); thinAlloc <= 16*mi; thinAlloc += 4 * mi {
				a := New(free, 1, []Image{{Size: 16 * mi, Allocated: thickAlloc}, {Size: 16 * mi, Allocated: thinAlloc, Thin: true}})
				if a.ThickAvailable() != a.ThinAvailable() {
					t.Fatalf("free %d, allocated %d/%d: thick %d, thin %d", free, thickAlloc, thinAlloc, a.ThickAvailable(), a.ThinAvailable())
				}
				owed := (16*mi - thickAlloc) + (16*mi - thinAlloc)
				if avail := a.ThickAvailable(); avail > 0 && owed+avail > free {
					t.Fatalf("free %d: %d owed and %d available", free, owed, avail)
				}
			}
		}
	}
}

func TestParseGuard(t *testing.T) {
	for in, want := range map[string]Guard{
		"5%":    {Percent: 5},
		"0.5%":  {Percent: 0.5},
		"0%":    {},
		"512Mi": {Bytes: 512 * mi},
		"2Gi":   {Bytes: 2 << 30},
		"4096":  {Bytes: 4096},
	} {
		got, err := ParseGuard(in)
		if err != nil || got != want {
			t.Errorf("ParseGuard(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "%", "-1%", "100%", "NaN%", "5 %x", "5MB", "-3", "1.5Gi", "99999999999Ti"} {
		if g, err := ParseGuard(in); err == nil {
			t.Errorf("ParseGuard(%q) = %+v, want an error", in, g)
		}
	}
	if got := (Guard{Percent: 5}).Threshold(1000 * mi); got != 50*mi {
		t.Errorf("5%% of 1000 MiB = %d", got)
	}
	if got := (Guard{Bytes: 7}).Threshold(1000 * mi); got != 7 {
		t.Errorf("7 bytes of 1000 MiB = %d", got)
	}
}

func TestCheckRatio(t *testing.T) {
	for _, r := range []float64{1, 1.5, 10} {
		if err := CheckRatio(r); err != nil {
			t.Errorf("CheckRatio(%v): %v", r, err)
		}
	}
	for _, r := range []float64{0, 0.99, -2, math.NaN(), math.Inf(1)} {
		if err := CheckRatio(r); err == nil {
			t.Errorf("CheckRatio(%v) accepted", r)
		}
	}
}
