# plot_log.gp - loss and loss scale over the steps of a fit, from the CSV
# log that mp_fit_desc.csv_path writes with csv_per_step (mnist_mlp --csv).
#
#   gnuplot -e "log='build/log_mixed_float16.csv'; out='build/log.png'" examples/plot_log.gp
#
# Loss on the left axis, the loss scale (log scale) on the right: the first
# steps under mixed_float16 show the scale falling to a workable value.
if (!exists("log")) log = 'build/log_mixed_float16.csv'
if (!exists("out")) out = 'build/log.png'
set terminal pngcairo size 900,500 noenhanced
set output out
set datafile separator ','
set key autotitle columnhead top right
set title log
set xlabel 'step'
set ylabel 'loss'
set y2label 'loss scale'
set logscale y2 2
set ytics nomirror
set y2tics
set grid
# step rows only: the kind column (1) is "step"
plot log using (strcol(1) eq 'step' ? $3 : NaN):4 with lines lw 1.5 title 'loss (running mean)', \
     log using (strcol(1) eq 'step' ? $3 : NaN):8 axes x1y2 with steps lw 1.5 title 'loss scale'
