#!/bin/sh
# On the GPU machine: train the default model (models/atlas-next), check it
# and evaluate it, in one call of under ten minutes. Through the device
# tool, from the repository root, with `.train-data` (make_data.py's output)
# carried and models/atlas-next/tokenizer.json in the tree:
#
#   run: sh tools/train/gpu-train.sh smoke   two eager steps at 8,192-token
#                                            rows (memory, the losses run)
#   run: sh tools/train/gpu-train.sh all     trains BUDGET_S seconds (430;
#                                            LONG_FRAC 0.25 of them on 8K
#                                            rows; COMPILE=0: no
#                                            torch.compile),
#                                            exports, builds the recall
#                                            prompts, checks with
#                                            transformers and writes the
#                                            goldens; with SESSION_S, a
#                                            call trains that long and
#                                            stops with a checkpoint until
#                                            the budget is spent, so that
#                                            back-to-back calls on one warm
#                                            machine make one run with one
#                                            learning-rate schedule; SHAPE
#                                            (train.py --shape) changes the
#                                            model's Config fields; INIT=DIR
#                                            starts from an exported model
#                                            (continued training, with LR,
#                                            MIN_LR_FRAC and WARMUP for its
#                                            new schedule)
#   run: sh tools/train/gpu-train.sh check   the check and the goldens
#                                            alone, of models/atlas-next
#
# Logs go to $OUT with what is kept: model.tar.part-* (the model and
# train-log.json in parts of at most 15 MiB, what the device tool brings
# back; `cat model.tar.part-* | tar x`), written as soon as the training
# ends, prompts.jsonl.xz and golden.tar.
set -eu
phase=${1:?usage: gpu-train.sh smoke|all|check}
work=${WORK:-/tmp/atlas-train}
out=${OUT:-/tmp/gpu-train-out}
budget_s=${BUDGET_S:-430}
long_frac=${LONG_FRAC:-0.25}
compile=--compile
[ "${COMPILE:-1}" = 0 ] && compile=
mkdir -p "$work/atlas-next" "$out"
[ -f "$work/atlas-next/tokenizer.json" ] || cp models/atlas-next/tokenizer.json "$work/atlas-next/"
export PYTHONUNBUFFERED=1
case $phase in
smoke)
	python3 tools/train/train.py --data .train-data --work "$work/smoke" \
		--model-out "$work/smoke/model" --arch next --short-len 8192 --long-len 8192 \
		${SHAPE:+--shape "$SHAPE"} \
		--max-steps 2 --val-rows 2 --workers 2 2>&1 | tee "$out/smoke.log"
	;;
all)
	python3 tools/train/train.py --data .train-data --work "$work" \
		--model-out "$work/atlas-next" --arch next --budget-s "$budget_s" --long-frac "$long_frac" \
		${SESSION_S:+--session-s "$SESSION_S"} ${SHAPE:+--shape "$SHAPE"} ${INIT:+--init "$INIT"} \
		$compile --workers 12 --lr "${LR:-2e-3}" --min-lr-frac "${MIN_LR_FRAC:-0.05}" \
		--warmup-steps "${WARMUP:-60}" >"$out/train.log" 2>&1 ||
		{ tail -n 40 "$out/train.log"; exit 1; }
	tail -n 3 "$out/train.log"
	# Paused with a checkpoint in WORK: the next call (same budget, on the
	# still-warm machine) goes on with the same schedule.
	grep -q '^paused at step' "$out/train.log" && exit 0
	tar cf - -C "$work" atlas-next train-log.json | split -b 15m - "$out/model.tar.part-"
	python3 tools/train/eval_recall.py make --model "$work/atlas-next" --data .train-data \
		--trials 20 --out "$out/prompts.jsonl.xz"
	python3 tools/train/check_hf.py --model "$work/atlas-next" --goldens "$work/golden" \
		2>&1 | tee "$out/check_hf.log"
	tar cf "$out/golden.tar" -C "$work" golden
	;;
check)
	python3 tools/train/check_hf.py --model models/atlas-next --goldens "$out/golden" \
		2>&1 | tee "$out/check_hf.log"
	;;
*)
	echo "gpu-train.sh: unknown phase $phase" >&2
	exit 2
	;;
esac
